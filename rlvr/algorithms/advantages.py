"""Advantage estimators: from one scalar reward per sequence to a [B, T] advantage per token.

Layout (shared with ``losses.py`` and the trainer): tensors are padded [B, T] over *response
tokens only*; ``mask`` is 1 on real response tokens and 0 on padding (and on sequences the loop
masked out); ``group_ids`` [B] says which prompt a sequence answers (GRPO's group).
``compute_advantages`` dispatches on ``cfg.advantage`` and returns ``(advantages, returns)``, both
[B, T] and zero on padding. Conventions, chosen once and used everywhere here: sample (unbiased)
standard deviations, as ``torch.std`` and verl's GRPO; sequence advantages broadcast over valid
tokens; ``returns`` as verl defines them; with ``kl_in = "reward"``, the KL enters as a reward.
Each convention, with a worked example: docs/algorithms.md ("Conventions").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar, cast

import torch
from torch import Tensor

from rlvr.recipe.schema import AlgorithmConfig

GRPO_EPS = 1e-6
"""Added to the std in GRPO-style normalisation (verl's default)."""
WHITEN_EPS = 1e-8
"""Added to the std in masked whitening."""
_Values = TypeVar("_Values", Tensor, float)


# --------------------------------------------------------------------------- group statistics


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Dense group index in [0, G) for arbitrary ids, and G."""
    # torch.unique is untyped (it dispatches on its flags at runtime); its second output is a tensor
    inverse = cast(Tensor, torch.unique(group_ids, return_inverse=True)[1])  # pyright: ignore[reportUnknownMemberType]
    return inverse, int(inverse.max().item()) + 1 if inverse.numel() else 0


def _group_sum(values: Tensor, index: Tensor, n_groups: int) -> Tensor:
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, index, values)


def group_mean(values: Tensor, group_ids: Tensor) -> Tensor:
    """Each element's group mean, broadcast back to [B]."""
    index, n = _group_index(group_ids)
    counts = _group_sum(torch.ones_like(values), index, n)
    return (_group_sum(values, index, n) / counts)[index]


def group_std(values: Tensor, group_ids: Tensor) -> Tensor:
    """Each element's group sample std (unbiased; 0 for a group of one), broadcast to [B]."""
    index, n = _group_index(group_ids)
    counts = _group_sum(torch.ones_like(values), index, n)
    means = _group_sum(values, index, n) / counts
    sq = _group_sum((values - means[index]).square(), index, n)
    var = torch.where(counts > 1, sq / (counts - 1).clamp(min=1), torch.zeros_like(sq))
    return var.sqrt()[index]


def batch_std(values: Tensor) -> Tensor:
    """Sample std of a flat tensor (unbiased; 0 for one element), as a 0-d tensor."""
    if values.numel() < 2:
        return torch.zeros((), dtype=values.dtype, device=values.device)
    return values.std(unbiased=True)


def normalize_rewards_per_group(
    rewards: Tensor, group_ids: Tensor, *, std_norm: str = "group", eps: float = GRPO_EPS
) -> Tensor:
    """GRPO's outcome advantage (Shao et al. 2024, sec. 4.1.2): (r - mean_group) / (std + eps).

    ``std_norm`` picks the std: ``group`` (GRPO), ``batch`` (Lite PPO, Liu et al. 2025
    "Tricks or Traps": group-level mean, batch-level std of the rewards) or ``none``
    (Dr.GRPO, Liu et al. 2025: the std term biases updates toward too-easy/too-hard prompts).
    """
    rewards = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    centered = rewards - group_mean(rewards, group_ids)
    if std_norm == "group":
        return centered / (group_std(rewards, group_ids) + eps)
    if std_norm == "batch":
        return centered / (batch_std(rewards) + eps)
    if std_norm == "none":
        return centered
    raise ValueError(f"unknown adv_std_norm {std_norm!r}; expected group, batch or none")


def rloo_baseline_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO (Ahmadian et al. 2024, eq. 7): r_i - mean_{j != i} r_j; 0 for a group of one."""
    index, n = _group_index(group_ids)
    counts = _group_sum(torch.ones_like(rewards), index, n)[index]
    sums = _group_sum(rewards, index, n)[index]
    loo_mean = (sums - rewards) / (counts - 1).clamp(min=1)
    return torch.where(counts > 1, rewards - loo_mean, torch.zeros_like(rewards))


def opo_baseline_advantages(rewards: Tensor, group_ids: Tensor, lengths: Tensor) -> Tensor:
    """OPO (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline"): r_i - b with the
    length-weighted baseline b = sum_j len_j r_j / sum_j len_j, the variance-minimising baseline
    when gradient norms grow with length. A group whose lengths sum to 0 falls back to its mean."""
    index, n = _group_index(group_ids)
    lengths = lengths.to(rewards.dtype)
    weight = _group_sum(lengths, index, n)
    weighted = _group_sum(lengths * rewards, index, n)
    plain = _group_sum(rewards, index, n) / _group_sum(torch.ones_like(rewards), index, n)
    baseline = torch.where(weight > 0, weighted / weight.clamp(min=1e-12), plain)
    return rewards - baseline[index]


def raft_mask(rewards: Tensor, *, threshold: float) -> Tensor:
    """RAFT/RAFT++ (Xiong et al. 2025): which sequences are trained on (reward > threshold), bool [B].

    The trainer should AND this into the loss mask so that negatives leave the loss's
    denominators too, not just its numerator (their advantage is already 0).
    """
    return rewards > threshold


# --------------------------------------------------------------------------- token-level tools


def masked_whiten(values: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = WHITEN_EPS) -> Tensor:
    """(x - mean) / (std + eps) over the valid tokens (sample std), zero on padding.

    This is the "batch normalisation" of REINFORCE++ (Hu et al. 2025) and PPO's advantage
    whitening: statistics are over every valid token of the batch, so a long sequence weighs
    more than a short one, as in OpenRLHF and verl.
    """
    m = mask.to(values.dtype)
    count = m.sum()
    mean = (values * m).sum() / count.clamp(min=1.0)
    var = ((values - mean).square() * m).sum() / (count - 1).clamp(min=1.0)
    out = (values - mean) if shift_mean else values
    return out / (var.sqrt() + eps) * m


def last_token_onehot(mask: Tensor) -> Tensor:
    """[B, T] float with a 1 on each row's last valid token (all zeros for an empty row)."""
    m = mask.to(torch.float32)
    positions = torch.arange(m.shape[-1], device=m.device, dtype=m.dtype).expand_as(m)
    last = (positions * m).argmax(dim=-1)
    onehot = torch.zeros_like(m).scatter_(1, last.unsqueeze(-1), 1.0)
    return onehot * (m.sum(-1, keepdim=True) > 0)


def token_level_rewards(rewards: Tensor, mask: Tensor, *, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """The outcome reward on the last valid token, minus ``kl_coef * kl`` on every valid token.

    This is the per-token reward of PPO-RLHF (Ouyang et al. 2022, eq. 2) and REINFORCE++
    (Hu et al. 2025, eq. 2: r_t = 1[t = EOS] r(x, y) - beta * KL_t).
    """
    m = mask.to(torch.float32)
    out = rewards.to(torch.float32).unsqueeze(-1) * last_token_onehot(m)
    if kl is not None and kl_coef != 0.0:
        out = out - kl_coef * kl.detach().to(torch.float32) * m
    return out


def discounted_returns(token_rewards: Tensor, mask: Tensor, *, gamma: float) -> Tensor:
    """Return-to-go G_t = sum_{k >= t} gamma^(k - t) r_k over valid tokens (padding skipped)."""
    m = mask.to(token_rewards.dtype)
    if gamma == 1.0:  # undiscounted: a reversed cumulative sum, no python loop over T
        return torch.flip(torch.cumsum(torch.flip(token_rewards * m, [-1]), -1), [-1]) * m
    out = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in range(token_rewards.shape[-1] - 1, -1, -1):
        step = token_rewards[:, t] + gamma * running
        running = m[:, t] * step + (1 - m[:, t]) * running
        out[:, t] = running
    return out * m


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, eq. 16), returns = A + V.

    delta_t = r_t + gamma * V_{t+1} - V_t with V after the last valid token = 0; A_t =
    delta_t + gamma * lam * A_{t+1}. Masked positions are skipped (the next valid token's value
    and advantage carry through them), as in verl, so the mask need not be a prefix.
    """
    m = mask.to(token_rewards.dtype)
    values = values.detach().to(token_rewards.dtype)
    adv = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[:, 0])
    last_gae = torch.zeros_like(token_rewards[:, 0])
    for t in range(token_rewards.shape[-1] - 1, -1, -1):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        next_value = m[:, t] * values[:, t] + (1 - m[:, t]) * next_value
        last_gae = m[:, t] * gae_t + (1 - m[:, t]) * last_gae
        adv[:, t] = last_gae
    adv = adv * m
    return adv, (adv + values) * m


# --------------------------------------------------------------------------- dispatch


_TOKEN_LEVEL = ("gae", "reinforce_pp", "reinforce_pp_baseline")


def compute_advantages(
    *,
    cfg: AlgorithmConfig,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    values: Tensor | None = None,
    kl: Tensor | None = None,
    kl_coef: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Advantages and returns, [B, T] each, zero on padding; dispatches on ``cfg.advantage``.

    ``rewards`` [B] are outcome rewards (after any shaping the loop did); ``values`` [B, T]
    the critic's (needed by ``gae``); ``kl`` [B, T] a per-token KL estimate vs the reference,
    used when ``cfg.kl_in == "reward"`` (required then). ``kl_coef`` overrides ``cfg.kl_coef``
    so an adaptive controller can pass its current value. After the estimator,
    ``cfg.adv_whiten`` whitens over valid tokens and ``cfg.adv_clip > 0`` clips.

    Estimators (``adv_std_norm`` in brackets where it applies):

    - ``gae``: per-token rewards, GAE(gamma, lam); returns = A + V.
    - ``grpo`` [group | batch | none]: (r - group mean) / std.
    - ``dr_grpo``: r - group mean (never divided by a std).
    - ``rloo`` [group | batch | none]: leave-one-out baseline, then optional std scaling.
    - ``reinforce`` [none: raw r | batch: (r - batch mean)/batch std | group: = grpo].
    - ``reinforce_pp`` [batch | none]: per-token rewards, discounted return-to-go, token whitening.
    - ``reinforce_pp_baseline`` [batch | none]: r - group mean, then as ``reinforce_pp``.
    - ``opo`` [group | batch | none]: length-weighted group baseline.
    - ``raft``: 1 where r > raft_threshold, else 0 (see ``raft_mask``).
    """
    if rewards.dim() != 1 or mask.dim() != 2 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(f"expected rewards [B] and mask [B, T], got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    m = mask.to(torch.float32)
    r = rewards.detach().to(torch.float32)
    estimator = cfg.advantage
    std_norm = cfg.adv_std_norm
    gamma = float(cfg.gamma)
    coef = float(cfg.kl_coef if kl_coef is None else kl_coef)
    kl_in_reward = cfg.kl_in == "reward" and coef != 0.0
    if kl_in_reward and kl is None:
        raise ValueError("kl_in = 'reward' needs the per-token `kl` tensor (kl_penalty vs the reference)")
    token_kl = kl if kl_in_reward else None

    if estimator not in _TOKEN_LEVEL and token_kl is not None:
        r = r - coef * (token_kl.detach().to(torch.float32) * m).sum(-1)

    if estimator == "gae":
        if values is None:
            raise ValueError("advantage = 'gae' needs `values` from the critic")
        lam = float(cfg.lam)
        adv, returns = gae_advantages(
            token_level_rewards(r, m, kl=token_kl, kl_coef=coef), values, m, gamma=gamma, lam=lam
        )
    elif estimator in ("reinforce_pp", "reinforce_pp_baseline"):
        if std_norm not in ("batch", "none"):
            raise ValueError(f"advantage = {estimator!r} normalises over the batch: adv_std_norm must be batch or none")
        if estimator == "reinforce_pp_baseline":
            r = r - group_mean(r, group_ids)
        returns = discounted_returns(token_level_rewards(r, m, kl=token_kl, kl_coef=coef), m, gamma=gamma)
        adv = masked_whiten(returns, m) if std_norm == "batch" else returns
    else:
        seq_adv = _sequence_advantages(estimator, r, group_ids, m, std_norm=std_norm, cfg=cfg)
        adv = seq_adv.unsqueeze(-1) * m
        returns = adv

    if cfg.adv_whiten:
        adv = masked_whiten(adv, m)
    clip = float(cfg.adv_clip)
    if clip > 0:
        adv = adv.clamp(-clip, clip)
    return adv * m, returns * m


def _sequence_advantages(
    estimator: str, r: Tensor, group_ids: Tensor, m: Tensor, *, std_norm: str, cfg: AlgorithmConfig
) -> Tensor:
    if estimator == "grpo":
        return normalize_rewards_per_group(r, group_ids, std_norm=std_norm)
    if estimator == "dr_grpo":
        return normalize_rewards_per_group(r, group_ids, std_norm="none")
    if estimator == "rloo":
        return _scale(rloo_baseline_advantages(r, group_ids), r, group_ids, std_norm)
    if estimator == "opo":
        return _scale(opo_baseline_advantages(r, group_ids, m.sum(-1)), r, group_ids, std_norm)
    if estimator == "reinforce":
        if std_norm == "none":
            return r
        if std_norm == "batch":
            return (r - r.mean()) / (batch_std(r) + GRPO_EPS)
        return normalize_rewards_per_group(r, group_ids, std_norm="group")
    if estimator == "raft":
        threshold = float(cfg.raft_threshold)
        return raft_mask(r, threshold=threshold).to(r.dtype)
    raise ValueError(f"unknown advantage estimator {estimator!r}")


def _scale(adv: Tensor, r: Tensor, group_ids: Tensor, std_norm: str) -> Tensor:
    """Divide a baselined advantage by the group's or the batch's reward std (or not)."""
    if std_norm == "group":
        return adv / (group_std(r, group_ids) + GRPO_EPS)
    if std_norm == "batch":
        return adv / (batch_std(r) + GRPO_EPS)
    if std_norm == "none":
        return adv
    raise ValueError(f"unknown adv_std_norm {std_norm!r}; expected group, batch or none")


# --------------------------------------------------------------------------- running moments


class RunningMoments:
    """Running mean and sample std of a scalar stream (Chan et al. parallel update).

    The rollout manager (``rlvr/collect/``) keeps one per domain for ``reward_norm =
    "domain"``: rewards of very different scales (a 0/1 math check, a 1-10 judge score) become
    comparable before advantages. Kept in python floats (float64) so ``state_dict`` round-trips
    exactly and a resumed run normalises bit-for-bit like the uninterrupted one.
    """

    def __init__(self) -> None:
        self.count = 0.0
        self.mean = 0.0
        self.m2 = 0.0

    @property
    def var(self) -> float:
        return self.m2 / (self.count - 1) if self.count > 1 else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def update(self, values: Tensor | Sequence[float]) -> None:
        xs = _floats(values) if isinstance(values, Tensor) else [float(v) for v in values]
        if not xs:
            return
        n_b = float(len(xs))
        mean_b = math.fsum(xs) / n_b
        m2_b = math.fsum((x - mean_b) ** 2 for x in xs)
        total = self.count + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / total
        self.m2 += m2_b + delta * delta * self.count * n_b / total
        self.count = total

    def normalize(self, values: _Values, *, eps: float = GRPO_EPS) -> _Values:
        """(x - mean) / (std + eps) with the current statistics (std taken as 1 while count < 2)."""
        std = self.std if self.count > 1 else 1.0
        return (values - self.mean) / (std + eps)

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.count = float(state["count"])
        self.mean = float(state["mean"])
        self.m2 = float(state["m2"])


def _floats(values: Tensor) -> list[float]:
    """A tensor's values as python floats (float64), flattened (torch types `tolist` loosely)."""
    return cast("list[float]", values.detach().double().flatten().tolist())  # pyright: ignore[reportUnknownMemberType]
