"""The vLLM environment from rlvr's side: is it there, which version, and the plug-in folder it loads.

vLLM lives in its own Python (`rollout.vllm.python`; `scripts/install-vllm.sh` builds one), and
three things cross over: `rlvr.recipe.checks.vllm_probe(python)` (does that interpreter have vLLM,
which version: what `validate` and `plan` say); `ensure_plugin_dir()`, the folder on the server's
PYTHONPATH through which vLLM's entry-point discovery finds rlvr's weight-transfer backend (a
minimal `.dist-info` and a link to this package, nothing else of rlvr's environment, whose torch
and transformers must not shadow vLLM's; made where the server starts, rewritten only when it
differs); and `ensure_generation_config(model)`, the folder for vLLM's `--generation-config` when
the model declares an EOS id vLLM would not stop at, else None.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import rlvr
from rlvr.recipe.vllm_python import cache_root  # one rule for rlvr's cache (RLVR_CACHE, else ~/.cache/rlvr)

PACKAGE = Path(rlvr.__file__).resolve().parent
ENTRY_POINTS = "[vllm.general_plugins]\nrlvr = rlvr.server.vllm_plugin:register\n"
DIST_INFO = "rlvr_vllm_plugin-1.0.dist-info"


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


def _eos_ids(value: object) -> list[int]:
    """An `eos_token_id` field (an int or a list of ints, or absent) as a list."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list | tuple):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def ensure_generation_config(model_path: str | Path) -> Path | None:
    """A folder holding the model's generation_config.json with every EOS id its config.json declares
    added to `eos_token_id`, for vLLM's `--generation-config`; None when nothing is missing.

    Why: rlvr's engines stop at every EOS id the model declares (the tokenizer's, config.json's and
    generation_config.json's: the embedded engine and SGLang read all three), but vLLM reads
    config.json's `eos_token_id` only when the folder has no generation_config.json, so an id that
    only config.json names would not end a response on vLLM (found with SmolLM2 and a config.json
    naming a second id: vLLM ran past it, the embedded engine stopped). The file is otherwise the
    model's own (vLLM takes only `eos_token_id` and the default `max_tokens` from it on rlvr's
    route). Made on the machine that starts the server, keyed by its content, written once."""
    folder = Path(model_path)
    try:
        config = json.loads((folder / "config.json").read_text())
        generation = json.loads((folder / "generation_config.json").read_text())
    except (OSError, ValueError):  # a hub id, or no generation_config.json (vLLM then reads config.json)
        return None
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    declared = _eos_ids(config.get("eos_token_id")) + _eos_ids(text_config.get("eos_token_id"))
    have = _eos_ids(generation.get("eos_token_id"))
    missing = [i for i in dict.fromkeys(declared) if i not in have]
    if not missing:
        return None
    generation["eos_token_id"] = have + missing
    text = json.dumps(generation, indent=2, sort_keys=True) + "\n"
    root = cache_root() / "vllm-generation-config" / hashlib.sha1(text.encode()).hexdigest()[:12]
    target = root / "generation_config.json"
    if not (target.exists() and target.read_text() == text):
        root.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(target)
    return root
