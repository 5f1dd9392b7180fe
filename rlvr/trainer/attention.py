"""`rlvr_packed`: varlen attention for packed rows without flash-attn (CPU, or GPUs without it).

It takes flash-attention's varlen arguments (`cu_seq_lens_q`, which transformers forwards to every
attention layer) and attends within each sequence's slice: cost sum(len_i^2), no N x N mask. A
slice runs the fast `is_causal` sdpa kernel unless the layer asks for more, and then it honours
exactly what transformers' own eager attention does for the family:
- a sliding window (`sliding_window`, forwarded per layer): key j is seen by query i only when
  i - j < window (transformers' `sliding_window_overlay`), by *position*, so a shared prompt's
  branches keep the window of their real positions;
- attention soft-capping (`softcap`, Gemma 2): tanh(scores / cap) * cap before the mask;
- attention sinks (`s_aux`, gpt-oss): one learned logit per head joins the softmax, then is dropped.
`rlvr_segments` (shared prompts) replaces the boundaries with slices that each carry their own tree
mask. Without either (padded micro-batches: right padding, so causal is exact) the whole row is one
slice. Registered with transformers' AttentionInterface on import, with no mask function, so
transformers builds no mask for it; the name holds no "sdpa" because transformers refuses any
"*sdpa*" implementation for models that declare no sdpa support (Gemma 2, gpt-oss), whose
soft-capping and sinks this function does honour. docs/trainer.md ("Packing, micro-batches and
ranks"); docs/models.md (the conformance matrix that checks it per family).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from rlvr.recipe.families import is_checked, uses_sinks
from rlvr.trainer.typed_torch import int_list

if TYPE_CHECKING:
    from rlvr.trainer.packing import Segment

PACKED_ATTENTION = "rlvr_packed"


class _Registry(Protocol):
    """transformers' AttentionInterface registry (its value type is an unannotated callable)."""

    def register(self, key: str, value: Callable[..., tuple[torch.Tensor, None]]) -> None: ...


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """query [B, heads, N, d], key/value [B, kv_heads, N, d] -> ([B, N, heads, d_v], None).

    `attention_mask` is never read: rows are packed (slices) or right-padded (causal is exact)."""
    # what MicroBatch.model_kwargs sends and what the family's attention layer adds, untyped
    cu = cast("torch.Tensor | None", kwargs.get("cu_seq_lens_q"))
    segments = cast("list[Segment] | None", kwargs.get("rlvr_segments"))
    window = cast("int | None", kwargs.get("sliding_window"))
    softcap = cast("float | None", kwargs.get("softcap"))
    sinks = cast("torch.Tensor | None", kwargs.get("s_aux"))
    if segments is None:
        bounds = int_list(cu) if cu is not None and query.shape[0] == 1 else [0, query.shape[2]]
        segments = [(s, e, None) for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    p = dropout if module.training else 0.0
    outs = [
        _slice_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], mask,
                         scale=scale, dropout=p, window=window, softcap=softcap, sinks=sinks)
        for s, e, mask in segments
        if e > s
    ]  # fmt: skip
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _slice_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tree: torch.Tensor | None,
    *,
    scale: float,
    dropout: float,
    window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """One slice [B, H, L, d] -> [B, H, L, d_v]: causal (`tree` None) or under a tree mask."""
    length = q.shape[2]
    allowed = tree[0, 0] if tree is not None else None
    if window is not None:
        pos = _positions(allowed, length, q.device)
        # the window only bites beyond the largest query-key distance the slice holds
        if (length - 1 if allowed is None else int(pos.max())) >= window:
            causal = allowed if allowed is not None else torch.ones(length, length, dtype=torch.bool, device=q.device)
            allowed = causal.tril() & ((pos[:, None] - pos[None, :]) < window)  # transformers' rule
    if softcap is None and sinks is None:
        # as transformers' sdpa calls it (same kernels, same rounding): GQA in the kernel without a
        # mask, repeated K/V heads with one; causal only from two queries on
        groups = q.shape[1] // k.shape[1]
        if allowed is not None and groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=dropout, is_causal=allowed is None and length > 1, scale=scale,
            enable_gqa=allowed is None and groups > 1,
        )  # fmt: skip
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    return _eager(q, k, v, allowed, scale=scale, dropout=dropout, softcap=softcap, sinks=sinks)


def _positions(allowed: torch.Tensor | None, length: int, device: torch.device) -> torch.Tensor:
    """Each token's position within its sequence. Under a tree mask a token sees exactly its
    ancestors (the shared prompt before it and its own branch), so its position is that count - 1."""
    if allowed is None:
        return torch.arange(length, device=device)
    return allowed.sum(-1) - 1


def _eager(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    *,
    scale: float,
    dropout: float,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Explicit scores, in the order transformers' eager attention of Gemma 2 / gpt-oss computes them."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    if sinks is None:
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    else:
        sink = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1).to(scores.dtype)
        logits = torch.cat([scores, sink], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]
    probs = F.dropout(probs, p=dropout, training=dropout > 0).to(v.dtype)
    return torch.matmul(probs, v)


cast(_Registry, AttentionInterface).register(PACKED_ATTENTION, packed_attention)


def default_attn_implementation(device: torch.device, *, model_type: str | None) -> str | None:
    """The trainer's attention for a family. In the conformance matrix (`rlvr.recipe.families`):
    flash_attention_2 on CUDA when flash-attn is installed and honours all the family does, else
    the packed attention above. Outside it: None, transformers' own choice (sdpa, else eager) with
    its own masks, which the trainer then runs unpacked (exact by construction, slower)."""
    if not is_checked(model_type):
        return None
    if device.type == "cuda" and not uses_sinks(model_type):
        try:
            import flash_attn  # noqa: F401  # pyright: ignore[reportMissingImports, reportUnusedImport]

            return "flash_attention_2"
        except ImportError:
            pass
    return PACKED_ATTENTION
