"""What the embedded engine's memory holds: the KV cache it can afford, and a line that says so.

The KV cache is preallocated, so its size is paid whether or not the batch fills it: a recipe
sizes it (`kv_cache_plan`), and the engine logs what it holds at start-up (`memory_report`).
Torch-free at import, like the engine's module.
"""

from __future__ import annotations

import os
from typing import Any


def kv_bytes_per_token(config: Any, dtype: Any) -> int:
    """Bytes of K and V one token takes in the fast path's cache (every layer)."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * dtype.itemsize


class KVBudgetError(ValueError):
    """The KV cache budget cannot hold one sequence of the engine's length."""


def kv_cache_plan(config: Any, *, dtype: Any, max_batch: int, max_len: int, budget_bytes: int | None) -> int:
    """Sequences the KV cache holds: `max_batch`, or fewer when `budget_bytes` cannot hold
    `max_batch` sequences of `max_len` tokens. Why a budget: the cache is preallocated, so its
    size is paid whether or not the batch fills it; a recipe sizes it to what it needs."""
    if budget_bytes is None:
        return max_batch
    per_sequence = kv_bytes_per_token(config, dtype) * max_len
    fits = budget_bytes // per_sequence
    if fits < 1:
        raise KVBudgetError(
            f"KV cache budget {budget_bytes / 1e9:.3g} GB holds no sequence of {max_len} tokens "
            f"({per_sequence / 1e9:.3g} GB each); raise the budget or shorten the sequences"
        )
    return int(min(max_batch, fits))


def memory_report(model: Any, backend: Any, *, max_batch: int, max_len: int, device: str) -> str:
    """One line: what the engine holds (weights, KV cache, packed weight copies, the rest)."""
    weights = sum(t.numel() * t.element_size() for t in _unique_tensors(model))
    kv = int(getattr(backend, "kv_cache_bytes", 0))
    packed = int(getattr(backend, "packed_bytes", 0))
    slots = int(getattr(backend, "max_slots", max_batch)) if kv else 0
    # On CPU the cache's pages are committed as positions are written (decoders._lazy_zeros):
    # what it holds now is inside the process RSS, hence inside "other".
    lazy = device == "cpu"
    line = (
        f"embedded engine holds: weights {_mb(weights)} ({str(model.dtype).removeprefix('torch.')}); "
        f"KV cache {slots * max_len if kv else 0} tokens = {slots} sequences x {max_len} tokens, "
        f"{_mb(kv)}{' at most, committed as written' if lazy else ''}; packed weight copies {_mb(packed)}"
    )
    rss = _rss_bytes()
    if rss and lazy:
        line += f"; other {_mb(max(0, rss - weights - packed))} (process RSS {_mb(rss)})"
    return line


def _unique_tensors(model: Any) -> list[Any]:
    seen: set[int] = set()
    out = []
    for tensor in model.state_dict(keep_vars=True).values():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out.append(tensor)
    return out


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _rss_bytes() -> int:
    """This process's resident set (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
