"""Group filters, overlong masking and DAPO's soft overlong punishment."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithms.filters import keep_group, overlong_mask, reward_std, soft_overlong_penalty
from rlvr.types import Completion, Group, RewardResult, Sample
from tests.unit.algorithms.helpers import cfg


def test_dynamic_sampling_drops_equal_groups_only() -> None:
    on = cfg(dynamic_sampling=True)
    assert not keep_group([1.0, 1.0, 1.0], cfg=on)
    assert not keep_group([0.0, 0.0], cfg=on)
    assert not keep_group([0.1, 0.1, 0.1], cfg=on)  # float noise in the std is not "variance"
    assert keep_group([1.0, 0.0, 1.0], cfg=on)
    assert keep_group([1.0, 1.0, 1.0], cfg=cfg(dynamic_sampling=False))
    assert not keep_group([], cfg=on)


def test_std_and_mean_thresholds() -> None:
    # sample std of [1, 0, 1] = sqrt(1/3) = .577 ; of [1, 0, 0, 0] = .5
    assert reward_std([1.0, 0.0, 0.0, 0.0]) == 0.5
    assert keep_group([1.0, 0.0, 1.0], cfg=cfg(min_group_std=0.5))
    assert not keep_group([1.0, 0.0, 0.0, 0.0], cfg=cfg(min_group_std=0.5))  # at the threshold: dropped
    assert not keep_group([1.0, 1.0], cfg=cfg(max_group_mean=0.99))
    assert keep_group([1.0, 0.0], cfg=cfg(max_group_mean=0.99))
    assert not keep_group([0.0, 0.0], cfg=cfg(min_group_mean=0.1))


def test_keep_group_accepts_groups_and_tensors() -> None:
    sample = Sample(id="a", tag="math", messages=[{"role": "user", "content": "1+1"}])
    group = Group(
        sample=sample,
        completions=[Completion(text="2", token_ids=[1], logprobs=[0.0])] * 2,
        rewards=[RewardResult(1.0), RewardResult(1.0)],
    )
    assert not keep_group(group, cfg=cfg(dynamic_sampling=True))
    assert keep_group(torch.tensor([0.0, 1.0]), cfg=cfg(dynamic_sampling=True))


def test_overlong_mask() -> None:
    reasons = ["stop", "length", "abort"]
    assert overlong_mask(reasons, cfg=cfg(overlong_mask=True)) == [True, False, True]
    assert overlong_mask(reasons, cfg=cfg(overlong_mask=False)) == [True, True, True]


def test_soft_overlong_penalty_piecewise() -> None:
    kw = {"max_new_tokens": 100, "buffer": 20, "penalty": 1.0}
    assert soft_overlong_penalty(50, **kw) == 0.0
    assert soft_overlong_penalty(80, **kw) == 0.0  # L_max - buffer: still free
    assert soft_overlong_penalty(90, **kw) == -0.5  # (80 - 90) / 20
    assert soft_overlong_penalty(100, **kw) == -1.0  # at L_max the ramp reaches -penalty
    assert soft_overlong_penalty(101, **kw) == -1.0
    assert soft_overlong_penalty(85, max_new_tokens=100, buffer=20, penalty=0.5) == -0.125
    assert soft_overlong_penalty(100, max_new_tokens=100, buffer=0, penalty=1.0) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300), st.integers(0, 300), st.integers(1, 200), st.integers(1, 100), st.floats(0, 5))
def test_soft_overlong_penalty_monotone_and_bounded(a: int, b: int, max_new: int, buffer: int, penalty: float) -> None:
    buffer = min(buffer, max_new)
    lo, hi = sorted((a, b))
    p_lo = soft_overlong_penalty(lo, max_new_tokens=max_new, buffer=buffer, penalty=penalty)
    p_hi = soft_overlong_penalty(hi, max_new_tokens=max_new, buffer=buffer, penalty=penalty)
    assert -penalty - 1e-12 <= p_hi <= p_lo + 1e-12 <= 1e-12
