"""Full (unsharded) weights in HF naming and layout, one tensor at a time, in a stable order.

The primitive under weight sync and HF export: FSDP2 and tensor parallel keep each parameter as a
DTensor shard, and `full_tensor()` all-gathers one at a time, so peak extra memory is one tensor,
not the model. Names are the transformers FQNs that SGLang's and transformers' loaders expect: a
transformers model has them already; a torchtitan model (`rlvr.trainer.titan.TitanLM`) maps its
own through torchtitan's state-dict adapter, layout changes included. `weight_sources` is the one
place that tells them apart (and merges a LoRA model's adapters: `rlvr.trainer.lora`), so sync's
metadata (`rlvr.sync.base.weight_specs`) and the gathered tensors always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from rlvr.trainer.dist import full_tensor
from rlvr.trainer.lora import is_lora, merged_sources

Source = tuple[str, torch.Tensor, Callable[[torch.Tensor], torch.Tensor] | None]


@runtime_checkable
class NamesHFWeights(Protocol):
    """A model that lists its own weights under transformers' names (`TitanLM`)."""

    def hf_sources(self, *, skip_tied: bool = True) -> list[Source]: ...


def weight_sources(model: nn.Module, *, skip_tied: bool = True) -> list[Source]:
    """(HF name, local or sharded tensor, layout change of the full tensor or None), in the
    order `iter_full_weights` yields them; no communication. A DTensor's `.shape` is the full
    shape, and layout changes keep shapes, so `tensor.shape` is what goes on the wire.

    `skip_tied` lists a tensor shared by several names (tied embeddings: `lm_head.weight`)
    once, under its first name, as HF checkpoints store it.
    """
    if isinstance(model, NamesHFWeights):
        return model.hf_sources(skip_tied=skip_tied)
    if is_lora(model):  # adapters merged in
        return merged_sources(model, skip_tied=skip_tied)
    seen: set[int] = set()
    out: list[Source] = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if skip_tied:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
        out.append((name, tensor, None))
    return out


def iter_full_weights(
    model: nn.Module, *, dtype: torch.dtype | None = None, skip_tied: bool = True, device: str | None = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, full tensor), the same on every rank (see `weight_sources`).

    Collective under FSDP2 / tensor parallel: *every* rank must iterate to the end in
    lockstep (each step is an all-gather); ranks other than 0 may simply drop what they get.
    `dtype` casts (e.g. bf16 for a rollout engine); `device="cpu"` moves each tensor off the
    accelerator (None keeps it where it is, e.g. on the GPU for an NCCL broadcast).
    """
    for name, tensor, layout in weight_sources(model, skip_tied=skip_tied):
        value = full_tensor(tensor).detach()
        if layout is not None:
            value = layout(value)
        if dtype is not None:
            value = value.to(dtype)
        if device is not None:
            value = value.to(device)
        yield name, value


def weight_names(model: nn.Module, *, skip_tied: bool = True) -> list[str]:
    """The names `iter_full_weights` yields, in order, without any communication."""
    return [name for name, _, _ in weight_sources(model, skip_tied=skip_tied)]
