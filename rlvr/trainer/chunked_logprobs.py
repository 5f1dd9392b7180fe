"""Per-token log-probs and entropy of the vocabulary projection, a chunk of tokens at a time.

Why: the policy loss needs log pi(target) and the entropy at every response token, both from one
`[K, V]` logits matrix, and at a real vocabulary that matrix and the copies log-softmax, the
entropy and their backward hold set the trainer's peak, not the model. Like fused
linear-cross-entropy kernels (Liger's, cut-cross-entropy), but in plain torch so it runs on CPU and
GPU: forward keeps only the target's log-prob, the log-sum-exp and the entropy of each token;
backward recomputes each chunk's logits from the saved hidden states and weight and accumulates the
gradients in fp32. So at most a few `[C, V]` blocks live at once, for one more head matmul. The
entropy's gradient is kept only in mode "grad" (docs/trainer.md, "Log-probs a chunk of tokens").
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

EntropyMode = Literal["none", "detached", "grad"]


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32, or float64 for float64 inputs (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """[c, V] logits / temperature of one chunk: the projection in the weight's dtype (as the LM
    head computes it), then an fp32 copy the softmax math runs on in place."""
    z = F.linear(h, weight, bias)
    z = z.to(_math_dtype(z.dtype))
    return z.div_(temperature) if temperature != 1.0 else z


class _Apply(Protocol):
    """`ChunkedLogprobs.apply` with its arguments (torch types `Function.apply` as `*args`)."""

    def apply(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        entropy: EntropyMode,
        chunk: int,
        /,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class ChunkedLogprobs(torch.autograd.Function):
    """(log-prob of each target [K], entropy [K] or empty) from hidden states [K, H] and the head."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        entropy: EntropyMode,
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k, dtype = hidden.shape[0], _math_dtype(hidden.dtype)
        logp = torch.empty(k, dtype=dtype, device=hidden.device)
        lse = torch.empty(k, dtype=dtype, device=hidden.device)
        ent = torch.empty(k if entropy != "none" else 0, dtype=dtype, device=hidden.device)
        for s in range(0, k, chunk):
            e = min(s + chunk, k)
            z = _chunk_logits(hidden[s:e], weight, bias, temperature)  # [c, V]
            top = z.amax(-1, keepdim=True)
            z.sub_(top)
            p = z.exp()  # unnormalised; two [c, V] blocks in all
            total = p.sum(-1, keepdim=True)
            log_total = total.log()
            z.sub_(log_total)  # z is log p now
            logp[s:e] = z.gather(-1, targets[s:e, None]).squeeze(-1)
            lse[s:e] = (top + log_total).squeeze(-1)
            if entropy != "none":
                ent[s:e] = -p.div_(total).mul_(z).sum(-1)
            del z, p
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent)
        ctx.temperature, ctx.entropy, ctx.chunk = temperature, entropy, chunk
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(  # pyright: ignore[reportIncompatibleMethodOverride] - names torch's *grad_outputs
        ctx: Any, g_logp: torch.Tensor, g_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        g_ent = (
            g_ent if ctx.entropy == "grad" and g_ent is not None and g_ent.numel() > 0 else None
        )  # None: no entropy gradient
        k = hidden.shape[0]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = _math_dtype(weight.dtype)  # fp32 accumulation over chunks
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
        for s in range(0, k, ctx.chunk):
            e = min(s + ctx.chunk, k)
            h = hidden[s:e]
            gl = g_logp[s:e, None]
            z = _chunk_logits(h, weight, bias, ctx.temperature)
            z.sub_(lse[s:e, None])  # log p
            # d logp_t / dz = onehot(t) - p;  d entropy / dz = -p * (log p + entropy)
            if g_ent is not None:
                p = z.exp()
                dz = z.add_(ent[s:e, None]).mul_(p).mul_(-g_ent[s:e, None]).sub_(p.mul_(gl))
                del p
            else:
                dz = z.exp_().mul_(-gl)
            dz.scatter_add_(1, targets[s:e, None], gl)
            if ctx.temperature != 1.0:
                dz.div_(ctx.temperature)
            if grad_h is not None:
                grad_h[s:e] = dz.to(weight.dtype) @ weight
            if grad_w is not None:
                grad_w.addmm_(dz.T, h.to(acc))
            if grad_b is not None:
                grad_b += dz.sum(0)
            del z, dz
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    entropy: EntropyMode = "detached",
    chunk_tokens: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(h @ W.T + b)[target] and the entropy per token, [K] fp32 each (entropy None for
    `entropy="none"`), as the full-logits computation gives them, in chunks of `chunk_tokens`."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    apply = cast(_Apply, ChunkedLogprobs).apply
    logp, ent = apply(hidden, weight, bias, targets, float(temperature), entropy, int(chunk_tokens))
    return logp, (ent if entropy != "none" else None)
