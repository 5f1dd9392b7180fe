"""Group and sample filters and reward shaping the loop applies before advantages.

Plain python on per-group reward lists (a ``Group`` with ``.scores``, a tensor, or any
sequence of numbers works): no torch needed to decide what to keep.

- ``keep_group``: DAPO dynamic sampling (Yu et al. 2025, eq. 11: keep a group only if
  0 < #correct < G, i.e. its rewards are not all equal) generalised to a std threshold, plus
  optional mean bounds (e.g. drop all-correct groups, Xiong et al. 2025's Reinforce-Rej).
- ``overlong_mask``: DAPO's overlong filtering — a truncated response has no verdict on its
  reasoning, so its loss is masked.
- ``soft_overlong_penalty``: DAPO's soft overlong punishment (eq. 13).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol, TypeAlias, cast, runtime_checkable

from rlvr.recipe.schema import AlgorithmConfig

_STD_TOL = 1e-12


@runtime_checkable
class _HasScores(Protocol):
    """A group of scored completions (``rlvr.types.Group``)."""

    @property
    def scores(self) -> list[float]: ...


@runtime_checkable
class _HasToList(Protocol):
    """A 1-d tensor or array of rewards."""

    def tolist(self) -> object: ...


@runtime_checkable
class _Scored(Protocol):
    """One reward result (``rlvr.types.RewardResult``)."""

    @property
    def score(self) -> float: ...


Rewards: TypeAlias = _HasScores | _HasToList | Iterable[float | _Scored]
"""What the filters accept as one group's rewards."""


def _scores(rewards: Rewards) -> list[float]:
    """Floats from a list, a tensor, an object with ``.scores`` (``rlvr.types.Group``) or ``.score`` items."""
    if isinstance(rewards, _HasScores):
        rewards = rewards.scores
    if isinstance(rewards, _HasToList):
        rewards = cast("list[float]", rewards.tolist())  # a 1-d tensor's python numbers
    return [float(r.score if isinstance(r, _Scored) else r) for r in rewards]


def reward_std(rewards: Rewards) -> float:
    """Sample (unbiased) std, the convention of ``advantages.py``; 0 for fewer than two rewards."""
    xs = _scores(rewards)
    if len(xs) < 2:
        return 0.0
    mean = math.fsum(xs) / len(xs)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def keep_group(rewards: Rewards, *, cfg: AlgorithmConfig) -> bool:
    """Whether a prompt group goes into the batch.

    Dropped when (a) ``cfg.dynamic_sampling`` or ``cfg.min_group_std > 0`` and the group's
    reward std is <= ``cfg.min_group_std`` (with 0: all rewards equal — zero advantage under
    any group baseline, so the group only dilutes the batch); (b) its mean reward is below
    ``cfg.min_group_mean`` or above ``cfg.max_group_mean`` when those are set (e.g.
    ``max_group_mean = 0.99`` drops all-correct groups of 0/1 rewards). An empty group is dropped.
    """
    xs = _scores(rewards)
    if not xs:
        return False
    min_std = float(cfg.min_group_std)
    if (cfg.dynamic_sampling or min_std > 0) and reward_std(xs) <= min_std + _STD_TOL:
        return False
    mean = math.fsum(xs) / len(xs)
    low = cfg.min_group_mean
    high = cfg.max_group_mean
    if low is not None and mean < low:
        return False
    return not (high is not None and mean > high)


def overlong_mask(finish_reasons: Iterable[str], *, cfg: AlgorithmConfig) -> list[bool]:
    """Per sequence, True = keep its loss. With ``cfg.overlong_mask``, truncated responses
    (``finish_reason == "length"``) get False; otherwise every entry is True."""
    reasons = list(finish_reasons)
    if not cfg.overlong_mask:
        return [True] * len(reasons)
    return [reason != "length" for reason in reasons]


def soft_overlong_penalty(length: int, *, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO eq. 13, added to the reward: 0 up to L_max - buffer, then a linear ramp to -penalty
    at L_max, and -penalty beyond. ``buffer`` <= 0 disables it (always 0).

        R(y) = 0                                        if |y| <= L_max - buffer
             = (L_max - buffer - |y|) / buffer * penalty  if L_max - buffer < |y| <= L_max
             = -penalty                                 if |y| > L_max
    """
    if buffer <= 0:
        return 0.0
    expected = max_new_tokens - buffer
    if length <= expected:
        return 0.0
    if length <= max_new_tokens:
        return (expected - length) / buffer * penalty
    return -penalty
