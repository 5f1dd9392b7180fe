"""Policy and value losses, and the one function that turns a [B, T] loss into a scalar.

Layout: padded [B, T] over response tokens only, ``mask`` 1 on real response tokens, one row per
*sequence* (a packed trainer unpacks its rows first: GSPO's ratio and the per-sequence means need
whole sequences). Every aggregation mode is a sum of per-token or per-sequence terms divided by a
constant, and the trainer passes the counts of the *whole mini-batch* (all micro-batches, all
ranks) as ``num_tokens`` / ``num_seqs`` (``loss_denominators``): then the micro-batch losses, and
their accumulated gradients, sum to the full-batch loss and gradient exactly, whatever the split.
That is what makes packed == padded and 2-rank == 1-rank; per-micro-batch counts would over-weight
short sequences. When the counts are None, the batch's own are used. The formulas: docs/algorithms.md.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from rlvr.algorithms.kl import kl_penalty
from rlvr.recipe.schema import AlgorithmConfig

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_LOG_RATIO_CLAMP = 20.0

Denominator = float | int | Tensor


def loss_denominators(mask: Tensor) -> tuple[float, float]:
    """(num_tokens, num_seqs) of a mask, counted as ``aggregate_loss`` counts them.

    Call it on the whole mini-batch (or sum it over micro-batches and all-reduce it over
    ranks) and pass the results to every micro-batch's loss call.
    """
    m = mask.to(torch.float32)
    return float(m.sum().item()), float((m.sum(-1) > 0).sum().item())


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    mode: str,
    num_tokens: Denominator | None = None,
    num_seqs: Denominator | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a [B, T] per-token loss to a scalar (see the module docstring for the modes).

    ``num_tokens`` / ``num_seqs`` are GLOBAL denominators over the whole mini-batch (every
    micro-batch on every rank); None uses this batch's own counts. ``max_len`` is Dr.GRPO's
    constant normaliser, the generation budget (``rollout.max_new_tokens``); None uses T,
    which is only constant if the trainer pads to the budget — pass it. Padding positions
    never contribute, even if ``loss_mat`` holds inf/nan there.
    """
    valid = mask.bool()
    masked = torch.where(valid, loss_mat, torch.zeros_like(loss_mat))
    if mode == "token-mean":
        denom = valid.sum().to(loss_mat.dtype) if num_tokens is None else num_tokens
        return masked.sum() / _at_least_one(denom)
    seq_tokens = valid.sum(-1)
    n_seqs = (seq_tokens > 0).sum().to(loss_mat.dtype) if num_seqs is None else num_seqs
    if mode == "seq-mean-token-sum":
        return masked.sum() / _at_least_one(n_seqs)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / seq_tokens.clamp(min=1).to(loss_mat.dtype)
        return per_seq.sum() / _at_least_one(n_seqs)
    if mode == "seq-mean-token-sum-norm":
        horizon = loss_mat.shape[-1] if max_len is None else max_len
        return masked.sum() / (_at_least_one(n_seqs) * horizon)
    raise ValueError(f"unknown loss_agg {mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


def _at_least_one(value: Denominator) -> Denominator:
    """Guard an empty (micro-)batch: 0 / 1 = 0 instead of 0 / 0 = nan."""
    if isinstance(value, Tensor):
        return value.clamp(min=1)
    return max(value, 1)


# --------------------------------------------------------------------------- ratios


def token_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log pi/pi_old per token, 0 on padding, clamped to +-20 so exp() stays finite."""
    diff = logprobs - old_logprobs.detach()
    return torch.where(mask.bool(), diff, torch.zeros_like(diff)).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO's token-level straight-through sequence ratio, in log space, [B, T].

    GSPO (Zheng et al. 2025, eq. 7 and the GSPO-token form, eq. 13): s_i = (pi(y_i)/pi_old(y_i))^(1/|y_i|)
    = exp(mean_t log r_it), and s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]. Its value is s_i on
    every token of sequence i; its gradient w.r.t. log pi(y_it) is s_i, so with sequence-mean
    aggregation the gradient is exactly GSPO's s_i * A_i * mean_t grad log pi(y_it).
    """
    m = mask.to(logprobs.dtype)
    diff = torch.where(mask.bool(), logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    seq = (diff * m).sum(-1) / m.sum(-1).clamp(min=1)
    seq = seq.detach().clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).unsqueeze(-1)
    live = torch.where(mask.bool(), logprobs, torch.zeros_like(logprobs))
    return (seq + live - live.detach()) * m


# --------------------------------------------------------------------------- per-token policy losses


def ppo_clip_loss(
    ratio: Tensor, advantages: Tensor, *, clip_low: float, clip_high: float, dual_clip_c: float = 0.0
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's pessimistic clipped surrogate (Schulman et al. 2017, eq. 7), per token.

    l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)). Asymmetric bounds are DAPO's
    clip-higher (Yu et al. 2025, eq. 10). With ``dual_clip_c`` > 1 and A < 0 the loss is also
    capped at -A c (Ye et al. 2020, "Mastering Complex Control in MOBA Games", eq. 5), so a
    huge ratio on a bad token cannot blow up. Returns (loss, clipped, dual_clipped), the last
    two as bool masks of where the clip (resp. dual clip) was active (zero gradient there).
    """
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(pg1, pg2)
    clipped = pg2 > pg1
    dual = torch.zeros_like(clipped)
    if dual_clip_c > 1.0:
        pg3 = -advantages * dual_clip_c
        negative = advantages < 0
        dual = negative & (loss > pg3)
        loss = torch.where(negative, torch.minimum(loss, pg3), loss)
    return loss, clipped, dual


def cispo_loss(
    ratio: Tensor, logprobs: Tensor, advantages: Tensor, *, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """CISPO (MiniMax-M1, Chen et al. 2025, eq. 4): -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi.

    The IS *weight* is clipped and detached instead of the update: every token keeps a
    gradient (A times the clipped weight), so rare "fork" tokens are never dropped. The paper
    sets no lower bound (eps_low large); the lower bound is floored at 0. Returns (loss, clipped).
    """
    low = max(1.0 - clip_low, 0.0)
    weight = ratio.detach().clamp(low, 1.0 + clip_high)
    clipped = (ratio.detach() < low) | (ratio.detach() > 1.0 + clip_high)
    return -weight * advantages * logprobs, clipped


def topr_loss(ratio: Tensor, logprobs: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor]:
    """TOPR (Le Roux et al. 2025, eq. 7), per token.

    A >= 0: -A log pi (no ratio: SFT-like, fast learning from positives even off-policy);
    A < 0:  -sg(clip(r, 0, 1)) A log pi (truncated IS: pushing down a sequence the policy has
    already made unlikely stops, keeping the objective bounded). Returns (loss, truncated)
    where truncated marks negative tokens whose ratio exceeded 1.
    """
    negative = advantages < 0
    weight = torch.where(negative, ratio.detach().clamp(0.0, 1.0), torch.ones_like(ratio))
    truncated = negative & (ratio.detach() > 1.0)
    return -weight * advantages * logprobs, truncated


def vanilla_pg_loss(logprobs: Tensor, advantages: Tensor) -> Tensor:
    """REINFORCE (Williams 1992): -A log pi."""
    return -advantages * logprobs


def tis_pg_loss(ratio: Tensor, logprobs: Tensor, advantages: Tensor, *, cap: float) -> tuple[Tensor, Tensor]:
    """Truncated-IS policy gradient: -sg(min(r, cap)) A log pi (no cap when ``cap`` <= 0).

    Unbiased off-policy REINFORCE up to the truncation (Ionides 2008; Espeholt et al. 2018's
    rho-bar), without PPO's zeroed gradients. Returns (loss, truncated).
    """
    limit = cap if cap > 0 else math.inf
    weight = ratio.detach().clamp(max=limit)
    return -weight * advantages * logprobs, ratio.detach() > limit


# --------------------------------------------------------------------------- rollout/trainer mismatch


def mismatch_keep(
    gap: Tensor, valid: Tensor, *, mode: Literal["token", "sequence", "geometric"], low: float, high: float
) -> Tensor:
    """Which tokens keep their policy gradient, [B, T] bool, given `gap` = log pi_old / pi_rollout.

    `token` (IcePop): each token whose ratio is in [low, high]. `sequence`: every token of a
    sequence whose probability ratio (the exp of the summed gap) is in the band; `geometric`: the
    same with its per-token geometric mean (the exp of the mean gap), which does not grow with
    length. Padding is never kept.
    """
    lo, hi = math.log(low), math.log(high)
    if mode == "token":
        inside = (gap >= lo) & (gap <= hi)
    else:
        g = torch.where(valid, gap, torch.zeros_like(gap))
        seq = g.sum(-1)
        if mode == "geometric":
            seq = seq / valid.sum(-1).clamp(min=1)
        inside = ((seq >= lo) & (seq <= hi)).unsqueeze(-1).expand_as(gap)
    return inside & valid


# --------------------------------------------------------------------------- dispatch


def compute_policy_loss(
    *,
    cfg: AlgorithmConfig,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Tensor | None = None,
    rollout_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    kl_coef: float | None = None,
    num_tokens: Denominator | None = None,
    num_seqs: Denominator | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The actor's loss for one (micro-)batch and its metrics; dispatches on ``cfg.policy_loss``.

    All inputs are [B, T]. ``logprobs`` carry the gradient; ``old_logprobs`` are pi_old, the
    trainer's log-probs at its weights when the step began (decoupled PPO's proximal policy: with
    one update per batch, the training forward's own, detached, so the ratio is 1 and the clip
    cannot bind; the clip acts from the second mini-batch or epoch on); ``rollout_logprobs`` the
    rollout engine's own, of the weights that sampled (older ones when asynchronous; vLLM/SGLang
    numerics differ from the trainer's too). The per-token loss is

        policy term (ppo_clip | gspo | cispo | topr | vanilla | tis)
          * sg(min(pi_old / pi_rollout, tis_cap))   if cfg.tis_cap > 0 and rollout_logprobs given
          * [pi_old / pi_rollout in the band]        if cfg.mismatch_mask (token, sequence, geometric)
        + kl_coef * KL_est(pi || pi_ref)            if cfg.kl_in == "loss"
        - entropy_coef * entropy                    if cfg.entropy_coef != 0

    aggregated by ``cfg.loss_agg`` with the global denominators (see the module docstring).
    The rollout correction is Yao et al. 2025 ("Your efficient RL framework secretly brings
    you off-policy RL training"): the sampler's distribution differs from the trainer's, and
    truncated IS on that gap removes the bias; for stale samples it is AReaL's decoupled PPO
    (Fu et al. 2025, eq. 5: weight pi_prox / pi_behav times the ratio clipped against pi_prox),
    with the weight truncated at the cap where AReaL's code drops the token
    (tests/unit/algorithms/test_off_policy.py). ``kl_coef`` overrides ``cfg.kl_coef`` (an
    adaptive controller passes its value). ``importance_level = "sequence"`` makes every
    ratio-based loss use GSPO's sequence ratio; ``policy_loss = "gspo"`` is PPO clip with it.

    Metrics are python floats over this micro-batch's own tokens: pg_loss, clip_frac,
    dual_clip_frac, approx_kl (k3 of pi_old vs pi), ratio_mean, ratio_max, and kl, entropy,
    tis_weight_mean, tis_clip_frac when they apply, plus loss.
    """
    kind = cfg.policy_loss
    valid = mask.bool()
    m = valid.to(logprobs.dtype)
    # Masked positions may hold anything (padding, -inf, nan): zero them before any product, so
    # their gradient is exactly 0 rather than 0 * inf = nan.
    logprobs = torch.where(valid, logprobs, torch.zeros_like(logprobs))
    adv = torch.where(valid, advantages.detach().to(logprobs.dtype), torch.zeros_like(logprobs))
    clip_low = float(cfg.clip_ratio_low)
    clip_high = float(cfg.clip_ratio_high)

    sequence_level = kind == "gspo" or cfg.importance_level == "sequence"
    if sequence_level:
        log_ratio = sequence_log_ratio(logprobs, old_logprobs, mask)
    else:
        log_ratio = token_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio)
    no_flag = torch.zeros_like(valid)
    dual = no_flag

    if kind in ("ppo_clip", "gspo"):
        dual_c = float(cfg.dual_clip_c)
        pg_mat, clipped, dual = ppo_clip_loss(ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip_c=dual_c)
    elif kind == "cispo":
        pg_mat, clipped = cispo_loss(ratio, logprobs, adv, clip_low=clip_low, clip_high=clip_high)
    elif kind == "topr":
        pg_mat, clipped = topr_loss(ratio, logprobs, adv)
    elif kind == "vanilla":
        pg_mat, clipped = vanilla_pg_loss(logprobs, adv), no_flag
    elif kind == "tis":
        pg_mat, clipped = tis_pg_loss(ratio, logprobs, adv, cap=float(cfg.tis_cap))
    else:
        raise ValueError(f"unknown policy_loss {kind!r}")

    metrics: dict[str, float] = {}
    tis_cap = float(cfg.tis_cap)
    if rollout_logprobs is not None:
        # Clamped log-ratio: finite weights at any gap, exactly 1 (log 0) on masked tokens.
        gap = token_log_ratio(old_logprobs.detach(), rollout_logprobs.detach(), mask)
        # k3 estimate of KL(pi_rollout || pi_old): how far the sampler (numerics, stale weights) is off.
        # The tokens were sampled by pi_rollout, so with r = pi_old / pi_rollout = exp(gap) the
        # estimator is (r - 1) - log r (Schulman's k3 with the sampler in the denominator). The
        # mirrored form, 1/r - 1 + log r, is not a KL estimate under these samples: a few tokens the
        # update made much less likely dominate it (quickstart, k = 1, step 6: 1.7 where this reads 0.019).
        metrics["mismatch_kl"] = _mean(torch.expm1(gap) - gap, valid)  # expm1: no cancellation near 0
        if tis_cap > 0:
            raw = torch.exp(gap)
            weight = raw.clamp(max=tis_cap)
            pg_mat = pg_mat * weight
            metrics["tis_weight_mean"] = _mean(weight, valid)
            metrics["tis_clip_frac"] = _mean((raw > tis_cap).to(m.dtype), valid)
        if cfg.mismatch_mask != "none":
            assert cfg.mismatch_low is not None and cfg.mismatch_high is not None  # the recipe checks it
            keep = mismatch_keep(gap, valid, mode=cfg.mismatch_mask, low=cfg.mismatch_low, high=cfg.mismatch_high)
            pg_mat = pg_mat * keep.to(pg_mat.dtype)
            metrics["mismatch_masked_frac"] = _mean((~keep).to(m.dtype), valid)

    total = pg_mat
    if cfg.kl_in == "loss":
        if ref_logprobs is None:
            raise ValueError("kl_in = 'loss' needs ref_logprobs (the reference model's log-probs)")
        coef = float(cfg.kl_coef if kl_coef is None else kl_coef)
        kl_mat = kl_penalty(logprobs, ref_logprobs.detach(), estimator=cfg.kl_estimator)
        total = total + coef * kl_mat
        metrics["kl"] = _mean(kl_mat.detach(), valid)
        metrics["kl_coef"] = coef
    elif ref_logprobs is not None:
        metrics["kl"] = _mean(kl_penalty(logprobs.detach(), ref_logprobs, estimator=cfg.kl_estimator), valid)

    entropy_coef = float(cfg.entropy_coef)
    if entropy_coef != 0.0:
        if entropy is None:
            raise ValueError("entropy_coef != 0 needs the per-token `entropy`")
        total = total - entropy_coef * entropy
    if entropy is not None:
        metrics["entropy"] = _mean(entropy.detach(), valid)

    mode = cfg.loss_agg
    loss = aggregate_loss(total, mask, mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)

    with torch.no_grad():
        metrics["pg_loss"] = float(aggregate_loss(pg_mat.detach(), mask, mode=mode, max_len=max_len).item())
        metrics["loss"] = float(aggregate_loss(total.detach(), mask, mode=mode, max_len=max_len).item())
        metrics["clip_frac"] = _mean(clipped.to(m.dtype), valid)
        metrics["dual_clip_frac"] = _mean(dual.to(m.dtype), valid)
        old_vs_new = token_log_ratio(logprobs.detach(), old_logprobs, mask)
        metrics["approx_kl"] = _mean(kl_penalty(old_vs_new, torch.zeros_like(old_vs_new), estimator="k3"), valid)
        r = ratio.detach()
        metrics["ratio_mean"] = _mean(r, valid)
        metrics["ratio_max"] = float(r[valid].max().item()) if bool(valid.any()) else 0.0
    return loss, metrics


def _mean(values: Tensor, valid: Tensor) -> float:
    """Masked mean as a python float (0 for an empty mask)."""
    count = int(valid.sum().item())
    if count == 0:
        return 0.0
    return float(torch.where(valid, values, torch.zeros_like(values)).sum().item() / count)


# --------------------------------------------------------------------------- value loss


def compute_value_loss(
    *,
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    value_clip: float,
    mode: str,
    num_tokens: Denominator | None = None,
    num_seqs: Denominator | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss, 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, +-c).

    As in OpenAI baselines' ppo2 and verl; ``value_clip`` <= 0 gives the plain 0.5 (V - R)^2.
    Aggregated like the policy loss (same mode, same global denominators).
    """
    valid = mask.bool()
    returns = returns.detach()
    unclipped = (values - returns).square()
    if value_clip > 0:
        old = old_values.detach()
        clipped_values = old + (values - old).clamp(-value_clip, value_clip)
        clipped_err = (clipped_values - returns).square()
        loss_mat = 0.5 * torch.maximum(unclipped, clipped_err)
        clip_flag = clipped_err > unclipped
    else:
        loss_mat = 0.5 * unclipped
        clip_flag = torch.zeros_like(valid)
    loss = aggregate_loss(loss_mat, mask, mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
    with torch.no_grad():
        metrics = {
            "vf_loss": float(aggregate_loss(loss_mat.detach(), mask, mode=mode, max_len=max_len).item()),
            "vf_clip_frac": _mean(clip_flag.to(values.dtype), valid),
            "value_mean": _mean(values.detach(), valid),
            "returns_mean": _mean(returns, valid),
        }
    return loss, metrics
