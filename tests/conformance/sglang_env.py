"""SGLang's own Python, installed outside the project's environment, for conformance tests.

Why not a dependency: SGLang pins another torch and needs CUDA to serve, so it never
enters rlvr's venv. Much of its Python imports on CPU, though, so the tests install the
wheel with `--no-deps` into a cache folder (plus the few packages the imported modules
need, pinned below) and run it only in subprocesses, with that folder on PYTHONPATH and
the venv's torch underneath. The version is `rlvr.rollout.sglang.SGLANG_VERSION`.

Two GPU-only imports are replaced by stubs in those subprocesses (see `sglang_boot.py`):
triton (a 1 GB compiler wheel; SGLang's own macOS stub, `sglang._platform_stubs`, stands in)
and torchvision (no wheel matches the CPU torch; only multimodal configs import it).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from rlvr.rollout.sglang import SGLANG_VERSION

HERE = Path(__file__).resolve().parent
BOOT = HERE / "sglang_boot.py"

# Imported by sglang.srt.{managers.io_struct, server_args, utils.common,
# model_executor.model_runner_components.weight_updater} and sglang.api.v1.api_types beyond
# what rlvr's venv has (found by importing them one missing module at a time).
DEPS = (
    "apache-tvm-ffi==0.1.15.post2",
    "compressed-tensors==0.20.1",
    "dill==0.4.1",
    "gguf==0.19.0",
    "httpcore2==2.16.2",  # openai's HTTP client (httpx2 and its own deps; a fresh venv has neither)
    "httpx2==2.16.2",
    "ipython==9.18.1",
    "loguru==0.7.3",
    "msgspec==0.23.0",
    "openai==3.57.0",
    "orjson==3.13.0",
    "partial-json-parser==0.2.1.1.post7",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "pyzmq==27.3.0",
    "requests==2.34.2",
    "sentencepiece==0.2.3",
    "sniffio==1.3.1",
    "starlette==1.10.0",
    "traitlets==5.16.1",
    "truststore==0.10.5",
    "urllib3==2.8.0",
)


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "rlvr" / f"sglang-{SGLANG_VERSION}"
    return Path(os.environ.get("RLVR_SGLANG_CACHE", default))


def ensure_sglang() -> tuple[Path | None, str]:
    """(site folder, "") once SGLang and its imports are in the cache, else (None, why not)."""
    root = cache_dir()
    site = root / "site"
    done = root / "complete.json"
    wanted = {"sglang": SGLANG_VERSION, "deps": list(DEPS)}
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time (parallel sessions share the cache)
        if done.exists() and json.loads(done.read_text()) == wanted:
            return site, ""
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target", str(site)]
        command += [f"sglang=={SGLANG_VERSION}", *DEPS]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"could not install sglang=={SGLANG_VERSION}: {exc}"
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["?"]
            return None, f"could not fetch sglang=={SGLANG_VERSION} from the package index: {tail[0]}"
        done.write_text(json.dumps(wanted))
    return site, ""


def sglang_env(site: Path) -> dict[str, str]:
    """The environment of a subprocess that runs SGLang's code (rlvr importable too)."""
    env = dict(os.environ)
    repo = str(HERE.parents[1])
    env["PYTHONPATH"] = os.pathsep.join([str(site), repo])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["SGLANG_CONFORMANCE_SITE"] = str(site)
    return env


def run_with_sglang(site: Path, script: str, *args: str, timeout_s: float = 300, stdin: str | None = None) -> str:
    """Run `tests/conformance/<script>` under SGLang's code; returns stdout, raises with stderr on failure."""
    command = [sys.executable, str(BOOT), str(HERE / script), *args]
    result = subprocess.run(
        command, env=sglang_env(site), input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"{script} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout


def popen_with_sglang(site: Path, script: str, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(BOOT), str(HERE / script), *args]
    return subprocess.Popen(
        command,
        env=sglang_env(site),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
