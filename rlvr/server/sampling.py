"""Batched next-token sampling with per-row settings and per-row reproducible randomness.

Why one uniform number per row (inverse-CDF sampling) instead of `torch.multinomial`: a row's
randomness must depend only on its own seed, never on which other sequences share the batch
(continuous batching reshuffles rows every step), and one float from the row's own `random.Random`
is O(1) per row where per-row torch Generators would need a vocab-sized draw each.

Logprobs follow SGLang's default: the log-softmax of the temperature-scaled logits, before
top-k/top-p/min-p truncation; greedy rows use temperature 1 (SGLang maps temperature 0 to
top_k = 1), so their logprobs are the raw model's. `original=True` reports the raw log-softmax for
every row (SGLang with `SGLANG_RETURN_ORIGINAL_LOGPROB=1`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlvr.rollout.base import SamplingParams


@dataclass(slots=True)
class RowSampling:
    """What the sampler needs of one row; `uniform` is drawn by the caller from the row's RNG."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    uniform: float

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature, self.top_k)


def is_greedy(temperature: float, top_k: int) -> bool:
    """SGLang's greedy rows: temperature 0 (maps to top_k = 1) or top_k = 1."""
    return temperature <= 1e-6 or top_k == 1


def truncates(top_p: float, top_k: int, min_p: float) -> bool:
    """Whether top-p/top-k/min-p cut the distribution (else a row samples from all of it)."""
    return top_p < 1.0 or top_k > 0 or min_p > 0.0


def sample_next(
    logits: torch.Tensor, params: Sequence[SamplingParams], rngs: Sequence[random.Random], *, original: bool
) -> tuple[list[int], list[float]]:
    """One token per row with that row's settings, drawing one uniform per row from its RNG (none
    when every row is greedy): the cheapest of the three samplers that gives the same tokens."""
    if all(is_greedy(p.temperature, p.top_k) for p in params):
        return sample_greedy(logits)  # no per-row settings or draws to gather
    if not original and not any(
        is_greedy(p.temperature, p.top_k) or truncates(p.top_p, p.top_k, p.min_p) for p in params
    ):
        # Every row samples from its full distribution: same draws as sample_rows, less Python.
        return sample_plain(logits, [p.temperature for p in params], [rng.random() for rng in rngs])
    rows = [
        RowSampling(p.temperature, p.top_p, p.top_k, p.min_p, rng.random()) for p, rng in zip(params, rngs, strict=True)
    ]
    return sample_rows(logits, rows, original=original)


def sample_greedy(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """Argmax of every row, with its logprob under the raw model (what SGLang reports for greedy)."""
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    picked = logits.gather(1, tokens[:, None]).squeeze(1)
    return tokens.tolist(), (picked - torch.logsumexp(logits, dim=-1)).tolist()


def sample_plain(
    logits: torch.Tensor, temperatures: list[float], uniforms: list[float]
) -> tuple[list[int], list[float]]:
    """Rows sampled from the full temperature-scaled distribution (no top-k/top-p/min-p):
    `sample_rows`' common case without building a `RowSampling` per row."""
    logits = logits.float()
    device = logits.device
    logp = torch.log_softmax(logits / torch.tensor(temperatures, device=device)[:, None], dim=-1)
    cdf = logp.exp().cumsum(dim=-1)
    target = torch.tensor(uniforms, device=device, dtype=cdf.dtype) * cdf[:, -1]
    tokens = torch.searchsorted(cdf, target[:, None], right=True).clamp_(max=logits.shape[-1] - 1)
    return tokens.squeeze(1).tolist(), logp.gather(1, tokens).squeeze(1).tolist()


def sample_rows(
    logits: torch.Tensor, rows: list[RowSampling], *, original: bool = False
) -> tuple[list[int], list[float]]:
    """Pick one token per row of `logits` [B, V]; return (token ids, their logprobs)."""
    logits = logits.float()
    greedy = [r.greedy for r in rows]
    if all(greedy):
        return sample_greedy(logits)

    device = logits.device
    temps = torch.tensor([1.0 if g else r.temperature for g, r in zip(greedy, rows, strict=True)], device=device)
    logp = torch.log_softmax(logits / temps[:, None], dim=-1)
    probs = logp.exp()
    uniforms = torch.tensor([r.uniform for r in rows], device=device, dtype=probs.dtype)

    # Plain rows sample from the full distribution; rows with top-k/top-p/min-p from the sorted,
    # truncated one. Each row always takes the same path, whatever else shares the batch.
    vocab = logits.shape[-1]
    cdf = probs.cumsum(dim=-1)
    tokens = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).clamp_(max=vocab - 1).squeeze(1)
    filtered = [i for i, r in enumerate(rows) if truncates(r.top_p, r.top_k, r.min_p)]
    if filtered:
        sub = [rows[i] for i in filtered]
        index = torch.tensor(filtered, device=device)
        sorted_probs, order = probs[index].sort(dim=-1, descending=True)
        cum = sorted_probs.cumsum(dim=-1)
        top_p = torch.tensor([r.top_p for r in sub], device=device, dtype=probs.dtype)
        keep = (cum - sorted_probs) < top_p[:, None]  # the most likely token is always kept
        top_k = torch.tensor([r.top_k if r.top_k > 0 else vocab for r in sub], device=device)
        keep &= torch.arange(vocab, device=device)[None, :] < top_k[:, None]
        min_p = torch.tensor([r.min_p for r in sub], device=device, dtype=probs.dtype)
        keep &= sorted_probs >= min_p[:, None] * sorted_probs[:, :1]
        sub_cdf = (sorted_probs * keep).cumsum(dim=-1)
        pick = torch.searchsorted(sub_cdf, (uniforms[index] * sub_cdf[:, -1])[:, None], right=True)
        tokens[index] = order.gather(1, pick.clamp_(max=vocab - 1)).squeeze(1)

    if any(greedy):
        greedy_mask = torch.tensor(greedy, device=device)
        tokens = torch.where(greedy_mask, logits.argmax(dim=-1), tokens)
    if original:
        logp = torch.log_softmax(logits, dim=-1)
    return tokens.tolist(), logp.gather(1, tokens[:, None]).squeeze(1).tolist()
