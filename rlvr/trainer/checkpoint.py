"""Checkpoints: DCP (sharded) save/resume, atomic, keep-last-k; and safetensors HF export.

A checkpoint root (the run's `checkpoints/`) holds `step_N/` folders (DCP shards of model and
optimizer, a LoRA model's adapters only; per-rank `rank_<r>.pt` with scheduler, RNG and the caller's
extra state; `meta.json`), `step_N.tmp/` for a save in progress (never read), and `latest`. A save
writes into `step_N.tmp/`, rank 0 renames it to `step_N/` and only then moves `latest`, so a kill
at any point leaves the previous checkpoint complete and pointed to; older ones are pruned only
after the new one is committed. Resume is exact: model, AdamW moments and step counts, lr
schedule, and whatever `extra` holds (data-mixture cursor, KL controller, RNG states) come back bit
for bit. The layout, drawn: docs/running.md ("Resume a run").
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import torch
from torch import nn

from rlvr.rundir import (
    CHECKPOINT_META,
    LATEST_FILE,
    RunDir,
    complete_checkpoints,
    is_checkpoint,
    step_dir,
    step_of,
    write_atomic,
    write_json_atomic,
)
from rlvr.trainer import dist as d
from rlvr.trainer.optim import load_scheduler_state
from rlvr.trainer.weights import iter_full_weights

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.optim.lr_scheduler import LRScheduler


_V = TypeVar("_V")


class Trainable(Protocol):
    """What a checkpoint part exposes: `Actor`, `Critic` and `ModelTrainer` all fit."""

    @property
    def model(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer | None: ...
    @property
    def scheduler(self) -> LRScheduler | None: ...


class SavesPretrained(Protocol):
    """A transformers config, generation config or tokenizer: what writes itself into a folder."""

    def save_pretrained(self, save_directory: Path, /) -> object: ...


def _options(part: Trainable) -> StateDictOptions:
    """A LoRA model's checkpoint holds its adapters only: the frozen base is the model's own
    folder (or seeded config), loaded again on resume, and would make every save a full copy."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(strict=False) if _lora_rank(part) else StateDictOptions()


def _lora_rank(part: Trainable) -> int:
    from rlvr.trainer.lora import lora_rank

    return lora_rank(part.model)


def _dcp_state(parts: Mapping[str, Trainable]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    state: dict[str, Any] = {}
    for name, part in parts.items():
        options = _options(part)
        if part.optimizer is not None:
            model_sd, optim_sd = get_state_dict(part.model, part.optimizer, options=options)
            state[name] = {"model": _trainable_only(part, model_sd), "optim": optim_sd}
        else:
            state[name] = {"model": _trainable_only(part, get_model_state_dict(part.model, options=options))}
    return state


def _trainable_only(part: Trainable, model_sd: dict[str, _V]) -> dict[str, _V]:
    """A LoRA model's adapters, by name: not by `requires_grad` (an export loads them into a frozen
    model), and not with torch's `ignore_frozen_params`, which keeps a frozen weight tied to
    another name (a tied LM head, vocab x hidden)."""
    if not _lora_rank(part):
        return model_sd
    return {k: v for k, v in model_sd.items() if ".lora_" in k}


def _check_lora(path: Path, parts: Mapping[str, Trainable]) -> None:
    """A checkpoint of adapters only cannot resume full fine-tuning, and the reverse: say so."""
    import json

    saved = json.loads((path / CHECKPOINT_META).read_text()).get("lora", {})
    for name, part in parts.items():
        was, now = int(saved.get(name, 0)), _lora_rank(part)
        if was != now:
            held = f"LoRA adapters of rank {was}" if was else "full weights"
            raise ValueError(
                f"{path}: holds {held} for {name!r} but this run has trainer.lora.rank = {now}; "
                "resume it with the recipe it was saved with (or start a new run)"
            )


class _DcpSave(Protocol):
    """`torch.distributed.checkpoint.state_dict_saver` as rlvr calls it (torch leaves a type unknown)."""

    def save(self, state_dict: dict[str, Any], *, checkpoint_id: str, no_dist: bool) -> object: ...


class _DcpLoad(Protocol):
    """`torch.distributed.checkpoint.state_dict_loader` as rlvr calls it."""

    def load(self, state_dict: dict[str, Any], *, checkpoint_id: str, no_dist: bool) -> None: ...


def _write_dcp(state: dict[str, Any], path: Path) -> None:
    """The slow part of a save (a seam for tests that simulate a crash mid-write)."""
    import torch.distributed.checkpoint.state_dict_saver as saver

    with _quiet_single_process():
        cast(_DcpSave, saver).save(state, checkpoint_id=str(path), no_dist=not d.is_dist())


def save_checkpoint(
    root: str | Path,
    step: int,
    parts: Mapping[str, Trainable],
    *,
    extra: Mapping[str, object] | None = None,
    keep_last: int | None = None,
    generation: int | None = None,
) -> Path:
    """Save `parts` (e.g. {"actor": actor, "critic": critic}) and this rank's `extra` at `step`.

    Collective: every rank calls it. `extra` is pickled per rank (pass each rank's own RNG
    states). Returns the committed `step_N` folder. `keep_last` prunes older checkpoints
    after the commit. `generation`: the saving trainer's; once a newer trainer was started in
    the run (`RunDir.check_generation`, under `root`'s parent) the save is refused before it
    writes anything, and again before the commit (StaleGeneration).
    """
    root = Path(root)
    fence = RunDir(root.parent)
    fence.check_generation(generation, doing=f"checkpoint step_{step}")
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    if d.rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    d.barrier()
    _write_dcp(_dcp_state(parts), tmp)
    local = {
        "schedulers": {n: p.scheduler.state_dict() for n, p in parts.items() if p.scheduler is not None},
        "extra": dict(extra or {}),
    }
    torch.save(local, tmp / f"rank_{d.rank()}.pt")
    d.barrier()
    if d.rank() == 0:
        meta: dict[str, object] = {
            "step": step,
            "world_size": d.world_size(),
            "parts": sorted(parts),
            "time": time.time(),
        }
        meta["lora"] = {n: r for n, p in parts.items() if (r := _lora_rank(p))}
        write_json_atomic(tmp / CHECKPOINT_META, meta, indent=2, durable=True)
        fence.check_generation(generation, doing=f"checkpoint step_{step}")  # a new trainer may start mid-save
        if final.exists():  # re-saving a step (e.g. after resuming from it): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
        write_atomic(root / LATEST_FILE, final.name, durable=True)
        if keep_last is not None:
            prune(root, keep_last=keep_last)
    d.barrier()
    return final


def load_checkpoint(path: str | Path, parts: Mapping[str, Trainable]) -> dict[str, Any]:
    """Restore `parts` in place from a `step_N` folder; returns this rank's `extra`.

    The world size may differ from the saving run for model/optimizer (DCP reshards); the
    extra state of rank r comes from rank_r.pt, or rank_0.pt when that rank did not exist.
    """
    import torch.distributed.checkpoint.state_dict_loader as loader
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    path = Path(path)
    if not is_checkpoint(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no meta.json)")
    _check_lora(path, parts)
    state = _dcp_state(parts)
    with _quiet_single_process():
        cast(_DcpLoad, loader).load(state, checkpoint_id=str(path), no_dist=not d.is_dist())
    for name, part in parts.items():
        options = _options(part)
        if part.optimizer is not None:
            set_state_dict(
                part.model,
                part.optimizer,
                model_state_dict=state[name]["model"],
                optim_state_dict=state[name]["optim"],
                options=options,
            )
        else:
            set_model_state_dict(part.model, state[name]["model"], options=options)
    own = path / f"rank_{d.rank()}.pt"
    local = torch.load(own if own.exists() else path / "rank_0.pt", weights_only=False, map_location="cpu")
    for name, part in parts.items():
        if part.scheduler is not None and name in local["schedulers"]:
            load_scheduler_state(part.scheduler, local["schedulers"][name])
    return local["extra"]


def prune(root: str | Path, *, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints, and abandoned `.tmp` saves
    of older steps; returns what was removed."""
    root = Path(root)
    done = complete_checkpoints(root)
    if not done:
        return []  # nothing committed yet: a `.tmp` may be the save in progress
    removed = done[: max(0, len(done) - keep_last)]
    newest = step_of(done[-1]) or 0
    for p in root.glob("step_*.tmp"):
        step = step_of(p.with_suffix(""))
        if step is not None and step <= newest:
            removed.append(p)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


@contextmanager
def _quiet_single_process() -> Generator[None]:
    """DCP warns that it "assumes" single-process mode; without a process group that is the intent."""
    with warnings.catch_warnings():
        if not d.is_dist():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def export_hf(
    model: nn.Module,
    tokenizer: SavesPretrained | None,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    max_shard_size: str = "5GB",
) -> Path | None:
    """Write a transformers folder (config, safetensors, tokenizer) from a (sharded) model.

    Collective: every rank gathers each full tensor (`iter_full_weights`), rank 0 keeps and
    writes them; the folder appears atomically (written as `<out>.tmp`, then renamed).
    `dtype` casts the weights (e.g. bf16 for serving) and records it in config.json.
    Returns the folder on rank 0, None elsewhere.
    """
    from huggingface_hub import save_torch_state_dict

    out = Path(out_dir)
    main = d.rank() == 0
    state: dict[str, torch.Tensor] = {}
    for name, tensor in iter_full_weights(model, dtype=dtype):
        if main:
            # A view into a larger buffer (the weight arena) is copied out: safetensors
            # refuses tensors that share storage with others.
            shares = tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size()
            state[name] = tensor.clone() if shares else tensor.contiguous()
    if main:
        tmp = out.with_name(out.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        save_torch_state_dict(state, tmp, max_shard_size=max_shard_size)
        finish_hf_folder(model, tmp, out, dtype=dtype, tokenizer=tokenizer)
    d.barrier()
    return out if main else None


def finish_hf_folder(
    model: nn.Module, tmp: Path, out: Path, *, dtype: torch.dtype | None, tokenizer: SavesPretrained | None
) -> None:
    """Beside the weights already in `tmp`: the model's config (`use_cache` back on, `dtype` the
    weights' when cast), generation config and tokenizer; plain file modes; then `tmp` becomes
    `out` (replacing it). Rank 0's last step of every transformers folder rlvr writes."""
    config = getattr(model, "config", None)
    if config is not None:
        config = config.__class__.from_dict(config.to_dict())
        config.use_cache = True  # training turned it off; inference wants it
        if dtype is not None:
            config.dtype = dtype
        config.save_pretrained(tmp)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    _plain_file_modes(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)


def _plain_file_modes(folder: Path) -> None:
    """Give every file the mode a plain `open()` gets (0644 under the usual umask): safetensors
    writes through a private temp file (0600), so the weights alone were unreadable to others."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)
