"""Full (unsharded) weights in HF naming, one tensor at a time, in a stable order.

The primitive under weight sync (bucketed broadcast to rollout engines) and HF export:
FSDP2 keeps each parameter as a DTensor shard; `full_tensor()` all-gathers one at a time so
peak extra memory is one tensor, not the model. Names are the transformers FQNs
(`model.layers.0.self_attn.q_proj.weight`) because fully_shard and HF gradient checkpointing
leave module paths untouched, which is what SGLang's and transformers' loaders expect.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


def iter_full_weights(
    model: nn.Module, *, dtype: torch.dtype | None = None, skip_tied: bool = True, device: str | None = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, full tensor) in `state_dict` order, the same on every rank.

    Collective under FSDP2: *every* rank must iterate to the end in lockstep (each step is
    an all-gather); ranks other than 0 may simply drop what they get. `skip_tied` yields a
    parameter shared by several names (tied embeddings: `lm_head.weight`) once, under its
    first name, as HF checkpoints store it. `dtype` casts (e.g. bf16 for a rollout engine);
    `device="cpu"` moves each tensor off the accelerator (None keeps it where it is, e.g.
    on the GPU for an NCCL broadcast).
    """
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if skip_tied:
            key = id(tensor)
            if key in seen:
                continue
            seen.add(key)
        full_tensor = getattr(tensor, "full_tensor", None)
        value = full_tensor() if full_tensor is not None else tensor
        value = value.detach()
        if dtype is not None:
            value = value.to(dtype)
        if device is not None:
            value = value.to(device)
        yield name, value


def weight_names(model: nn.Module, *, skip_tied: bool = True) -> list[str]:
    """The names `iter_full_weights` yields, in order, without any communication."""
    seen: set[int] = set()
    names = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if skip_tied and id(tensor) in seen:
            continue
        seen.add(id(tensor))
        names.append(name)
    return names
