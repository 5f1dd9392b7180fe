"""Per-token log-probs and entropy of the vocabulary projection, a chunk of tokens at a time.

Why: the policy loss needs log pi(target) and the entropy at every response token, both from one
`[K, V]` logits matrix, and at a real vocabulary that matrix and the copies log-softmax, the
entropy and their backward hold set the trainer's peak, not the model. Like fused
linear-cross-entropy kernels (Liger's, cut-cross-entropy), but in plain torch so it runs on CPU and
GPU: forward keeps only the target's log-prob, the log-sum-exp and the entropy of each token;
backward recomputes each chunk's logits from the saved hidden states and weight and accumulates the
gradients in fp32. So at most a few `[C, V]` blocks live at once, for one more head matmul. The
entropy's gradient is kept only in mode "grad" (docs/trainer.md, "Log-probs a chunk of tokens").
A model that changes the head's output before returning it (Gemma 2/3's final soft-capping,
Cohere's logit scale, Granite's logit divisor) has that change done here, as `LogitTransform`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

EntropyMode = Literal["none", "detached", "grad"]


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32, or float64 for float64 inputs (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


@dataclass(frozen=True)
class LogitTransform:
    """What a model's forward does to its LM head's output before returning it, as transformers
    does it: in the head's dtype, `* multiply` (Cohere's `logit_scale`), `/ divide` (Granite's
    `logits_scaling`), then `softcap * tanh(x / softcap)` (Gemma 2/3's `final_logit_softcapping`),
    each step only where it is not the identity, so the ops and their rounding are the model's."""

    multiply: float = 1.0
    divide: float = 1.0
    softcap: float | None = None

    def __post_init__(self) -> None:
        if self.divide == 0.0 or (self.softcap is not None and self.softcap <= 0.0):
            raise ValueError(f"not a logit transform: {self}")


def _chunk_logits(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    post: LogitTransform | None,
    *,
    keep_tanh: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[c, V] logits / temperature of one chunk: the projection and `post` in the weight's dtype (as
    the LM head and the model's forward compute them), then an fp32 copy the softmax math runs on in
    place. With `keep_tanh` and a soft-cap, also tanh(x / softcap) [c, V] in the weight's dtype (its
    derivative is the backward's), else None."""
    z = F.linear(h, weight, bias)
    t = None
    if post is not None:
        if post.multiply != 1.0:
            z.mul_(post.multiply)
        if post.divide != 1.0:
            z.div_(post.divide)
        if post.softcap is not None:
            z.div_(post.softcap).tanh_()
            if keep_tanh:
                t, z = z, z * post.softcap
            else:
                z.mul_(post.softcap)
    z = z.to(_math_dtype(z.dtype))
    return (z.div_(temperature) if temperature != 1.0 else z), t


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
        post: LogitTransform | None,
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
        post: LogitTransform | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k, dtype = hidden.shape[0], _math_dtype(hidden.dtype)
        logp = torch.empty(k, dtype=dtype, device=hidden.device)
        lse = torch.empty(k, dtype=dtype, device=hidden.device)
        ent = torch.empty(k if entropy != "none" else 0, dtype=dtype, device=hidden.device)
        for s in range(0, k, chunk):
            e = min(s + chunk, k)
            z, _ = _chunk_logits(hidden[s:e], weight, bias, temperature, post)  # [c, V]
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
        ctx.temperature, ctx.entropy, ctx.chunk, ctx.post = temperature, entropy, chunk, post
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
        post: LogitTransform | None = ctx.post
        for s in range(0, k, ctx.chunk):
            e = min(s + ctx.chunk, k)
            h = hidden[s:e]
            gl = g_logp[s:e, None]
            z, t = _chunk_logits(h, weight, bias, ctx.temperature, post, keep_tanh=True)
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
            if t is not None:  # d softcap * tanh(x / softcap) / dx = 1 - tanh^2
                dz.mul_(t.to(dz.dtype).square_().neg_().add_(1))
            if post is not None and post.multiply != 1.0:
                dz.mul_(post.multiply)
            if post is not None and post.divide != 1.0:
                dz.div_(post.divide)
            if grad_h is not None:
                grad_h[s:e] = dz.to(weight.dtype) @ weight
            if grad_w is not None:
                grad_w.addmm_(dz.T, h.to(acc))
            if grad_b is not None:
                grad_b += dz.sum(0)
            del z, dz, t
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None, None


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    entropy: EntropyMode = "detached",
    chunk_tokens: int = 1024,
    post: LogitTransform | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(post(h @ W.T + b) / temperature)[target] and the entropy per token, [K] fp32 each
    (entropy None for `entropy="none"`), as the full-logits computation gives them, in chunks of
    `chunk_tokens`; `post` (None: none) is what the model does to its head's output."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if post == LogitTransform():
        post = None
    apply = cast(_Apply, ChunkedLogprobs).apply
    logp, ent = apply(hidden, weight, bias, targets, float(temperature), entropy, int(chunk_tokens), post)
    return logp, (ent if entropy != "none" else None)
