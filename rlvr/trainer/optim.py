"""AdamW and the learning-rate schedule (linear warmup, then constant / cosine / linear decay).

The schedule is a pure function of the optimizer-step index so it can be tested on its
own and so a resumed run (LambdaLR's `last_epoch` restored from the checkpoint) lands on
exactly the lr the uninterrupted run would have used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR

from rlvr.recipe.schema import TrainerConfig


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based).

    Warmup reaches the peak on step `warmup_steps - 1` (step 0 already trains, at
    peak / warmup_steps). Decay runs from the end of warmup to `total_steps`, ending at
    `min_lr_ratio`, and stays there if training goes on longer.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress)
    raise ValueError(f"unknown lr schedule {schedule!r}")


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: TrainerConfig, *, lr: float | None = None
) -> torch.optim.AdamW:
    """AdamW over the (possibly DTensor-sharded) parameters; `lr` overrides `cfg.lr` (the critic's).

    The fused kernel where every parameter allows it: one pass over each tensor instead of
    foreach's several (on CPU about 5x faster for the step itself, docs/trainer.md)."""
    trainable = [p for p in params if p.requires_grad]
    fused = bool(trainable) and all(
        p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.bfloat16, torch.float16)
        for p in trainable
    )
    return torch.optim.AdamW(
        trainable,
        lr=lr if lr is not None else cfg.lr,
        betas=cfg.betas,
        weight_decay=cfg.weight_decay,
        eps=1e-8,
        fused=fused or None,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainerConfig, *, total_steps: int) -> LambdaLR:
    """LambdaLR over `lr_factor`; `total_steps` counts optimizer steps
    (RL steps x ppo_epochs x mini_batches)."""
    fn = partial(
        lr_factor,
        schedule=cfg.lr_schedule,
        warmup_steps=cfg.warmup_steps,
        total_steps=total_steps,
        min_lr_ratio=cfg.min_lr_ratio,
    )
    return LambdaLR(optimizer, lr_lambda=fn)


def load_scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler, state: dict[str, object]) -> None:
    """Restore a scheduler *and* push its current lr into the optimizer.

    `LRScheduler.load_state_dict` alone leaves the optimizer's lr untouched; the restored
    optimizer state usually carries it too, but this makes the schedule the single source.
    """
    scheduler.load_state_dict(state)
    for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
        group["lr"] = lr
