"""The vLLM environment from rlvr's side: is it there, which version, and the plug-in folder it loads.

vLLM lives in its own Python (`rollout.vllm.python`; `scripts/install-vllm.sh` builds one).
Two things cross over:

- `rlvr.recipe.checks.vllm_probe(python)`: does that interpreter exist and have vLLM, and
  which version (what `rlvr validate` and `rlvr plan` say).
- `ensure_plugin_dir()`: the folder put on the server's PYTHONPATH so vLLM finds rlvr's
  weight-transfer backend. vLLM discovers plug-ins by entry point
  (`vllm.general_plugins`), so the folder holds a minimal `.dist-info` naming
  `rlvr.rollout.vllm_backend:register` and a link to this `rlvr` package (so the backend's
  own imports, `rlvr.rollout.dist` and `rlvr.rollout.lora_merge` for LoRA adapter pushes, come
  with it), and nothing else of rlvr's environment (whose torch and transformers must not
  shadow vLLM's). Made on the machine that starts the server (the local launcher, a SLURM
  node), keyed by where this package lives, rewritten only when it differs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import rlvr

PACKAGE = Path(rlvr.__file__).resolve().parent
ENTRY_POINTS = "[vllm.general_plugins]\nrlvr = rlvr.rollout.vllm_backend:register\n"
DIST_INFO = "rlvr_vllm_plugin-1.0.dist-info"


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
