"""`rlvr_packed_sdpa`: varlen attention for packed rows without flash-attn (CPU, or GPUs without it).

It takes flash-attention's varlen arguments (`cu_seq_lens_q`, which transformers forwards to every
attention layer) and runs causal sdpa on each sequence's slice: cost sum(len_i^2), no N x N mask,
the fast `is_causal` kernels. `rlvr_segments` (shared prompts) replaces the boundaries with slices
that each carry their own tree mask. Without either (padded micro-batches) it is plain sdpa.
Registered with transformers' AttentionInterface on import, with no mask function, so
transformers builds no mask for it. docs/trainer.md ("Packing, micro-batches and ranks").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

import torch
import transformers.integrations.sdpa_attention as sdpa_module
from transformers import AttentionInterface

from rlvr.trainer.typed_torch import int_list

if TYPE_CHECKING:
    from rlvr.trainer.packing import Segment

PACKED_SDPA = "rlvr_packed_sdpa"


class _Sdpa(Protocol):
    """transformers' sdpa attention as rlvr calls it (its `**kwargs` is unannotated)."""

    def sdpa_attention_forward(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        /,
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]: ...


class _Registry(Protocol):
    """transformers' AttentionInterface registry (its value type is an unannotated callable)."""

    def register(self, key: str, value: Callable[..., tuple[torch.Tensor, None]]) -> None: ...


_sdpa = cast(_Sdpa, sdpa_module)


def packed_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """query/key/value [1, heads, N, head_dim] -> ([1, N, heads, head_dim], None)."""
    # what MicroBatch.model_kwargs sends, forwarded by transformers as untyped keywords
    cu = cast("torch.Tensor | None", kwargs.pop("cu_seq_lens_q", None))
    segments = cast("list[Segment] | None", kwargs.pop("rlvr_segments", None))
    for unused in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(unused, None)
    if segments is None and cu is not None:
        bounds = int_list(cu)
        segments = [(s, e, None) for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    if segments is None or query.shape[0] != 1:
        return _sdpa.sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    outs = [
        _sdpa.sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], mask, dropout, scaling,
                               is_causal=mask is None, **kwargs)[0]
        for s, e, mask in segments
        if e > s
    ]  # fmt: skip
    return torch.cat(outs, dim=1), None


cast(_Registry, AttentionInterface).register(PACKED_SDPA, packed_sdpa_attention)


def default_attn_implementation(device: torch.device) -> str:
    """flash_attention_2 on CUDA when flash-attn is installed, else the packed sdpa above."""
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401  # pyright: ignore[reportMissingImports, reportUnusedImport]

            return "flash_attention_2"
        except ImportError:
            pass
    return PACKED_SDPA
