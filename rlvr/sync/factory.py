"""`make_weight_sync`: pick the sync method a recipe asks for.

auto: an in-process engine -> inprocess; rollout servers -> broadcast. disk only when the
recipe says so (`sync.method = "disk"`, e.g. trainer and rollout nodes cannot share a
group). A LoRA policy with `sync.lora = "adapter"` pushes its adapters through the shared
directory (`AdapterSync`) to servers; merged, it goes by the method like any model (its
weights are merged on the fly, `rlvr.trainer.lora.merged_sources`); in process, always merged. Trainer rank 0 decides and tells the other ranks (they have no client or engine),
so every rank builds the same kind of sync.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.recipe.schema import SyncConfig
from rlvr.sync.base import WeightSync

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedTokenizerBase


def resolve_method(method: str, *, has_client: bool, has_engine: bool) -> str:
    if method != "auto":
        return method
    if has_engine:
        return "inprocess"
    if has_client:
        return "broadcast"
    raise ValueError("sync.method = auto needs a rollout client (servers) or an in-process engine")


def make_weight_sync(
    cfg: SyncConfig,
    *,
    model: nn.Module,
    client: object = None,
    engine: object = None,
    run_dir: str | Path | None = None,
    dtype: torch.dtype | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    **kwargs: Any,  # the chosen sync class's own options (e.g. `master_address`, test seams)
) -> WeightSync:
    """Build the `WeightSync` for `cfg` (a `SyncConfig`). Collective: call on every trainer rank.

    `client`: the loop's `SGLangClient` (rank 0); `engine`: an in-process `EmbeddedEngine`
    (rank 0); `run_dir`: default `shared_dir` for disk; `dtype`: the engines' weight dtype
    on the wire; extra `kwargs` go to the sync class (e.g. `master_address`).
    """
    from rlvr.trainer import dist as d

    method = None
    if d.rank() == 0:
        method = resolve_method(cfg.method, has_client=client is not None, has_engine=engine is not None)
    method = d.broadcast_object(method)
    from rlvr.trainer.lora import is_lora

    adapters = is_lora(model) and cfg.lora == "adapter"
    if adapters and method != "inprocess":  # a LoRA policy's adapters only, whatever the method
        from rlvr.sync.adapter import AdapterSync

        shared = cfg.shared_dir or run_dir
        if shared is None:
            raise ValueError("sync.lora = adapter needs sync.shared_dir or a run directory")
        return AdapterSync(
            model, shared_dir=shared, client=client, timeout_s=cfg.timeout_s, on_engine_failure=cfg.on_engine_failure,
            **kwargs,
        )  # fmt: skip
    if method == "inprocess":
        from rlvr.sync.inprocess import InProcessSync

        return InProcessSync(model, engine=engine, bucket_mb=cfg.bucket_mb, dtype=dtype, verify=cfg.verify, **kwargs)
    common = {"client": client, "timeout_s": cfg.timeout_s, "on_engine_failure": cfg.on_engine_failure, "dtype": dtype}
    common["verify"] = cfg.verify
    if method == "broadcast":
        from rlvr.sync.broadcast import BroadcastSync

        return BroadcastSync(model, bucket_mb=cfg.bucket_mb, wire_format=cfg.wire_format, **common, **kwargs)
    if method == "disk":
        from rlvr.sync.disk import DiskSync

        shared = cfg.shared_dir or run_dir
        if shared is None:
            raise ValueError("sync.method = disk needs sync.shared_dir or a run directory")
        return DiskSync(model, shared_dir=shared, tokenizer=tokenizer, **common, **kwargs)
    raise ValueError(f"unknown sync method {method!r}")
