"""Advantage estimators against hand-computed numbers (sample std convention: torch.std)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithms.advantages import (
    RunningMoments,
    compute_advantages,
    discounted_returns,
    gae_advantages,
    group_std,
    last_token_onehot,
    masked_whiten,
    normalize_rewards_per_group,
    raft_mask,
)
from tests.unit.algorithms.helpers import cfg

ONES = torch.ones(4, 3)


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_grpo_one_group_uses_sample_std() -> None:
    # mean 0.5, sample std sqrt((4 * 0.25) / 3) = 0.57735 -> +-0.5 / (0.57735 + 1e-6) = +-0.866024
    adv, returns = compute_advantages(
        cfg=cfg(advantage="grpo", adv_std_norm="group"),
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]),
        group_ids=torch.zeros(4, dtype=torch.long),
        mask=ONES,
    )
    expected = torch.tensor([0.866024, -0.866024, 0.866024, -0.866024]).unsqueeze(-1).expand(4, 3)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, adv)


def test_grpo_broadcasts_over_valid_tokens_only_and_zero_variance_group_is_zero() -> None:
    mask = t([1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1])
    adv, _ = compute_advantages(
        cfg=cfg(advantage="grpo"),
        rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]),
        group_ids=torch.tensor([7, 7, 3, 3]),
        mask=mask,
    )
    # group 7: [1, 0] mean .5, sample std sqrt(.5) = .707107 -> +-.707106; group 3: all equal -> 0
    expected = t([0.707106, 0.707106, 0], [-0.707106, 0, 0], [0, 0, 0], [0, 0, 0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_lite_ppo_group_mean_batch_std() -> None:
    # group means [.5, .5, 0, 0]; batch std of [1, 0, 0, 0]: var = (.5625 + 3 * .0625) / 3 = .25 -> .5
    adv = normalize_rewards_per_group(
        torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1]), std_norm="batch", eps=0.0
    )
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_dr_grpo_is_mean_centred_only() -> None:
    adv, _ = compute_advantages(
        cfg=cfg(advantage="dr_grpo", adv_std_norm="group"),  # dr_grpo never divides by a std
        rewards=torch.tensor([1.0, 0.0, 0.0, 2.0, 4.0]),
        group_ids=torch.tensor([0, 0, 0, 1, 1]),
        mask=torch.ones(5, 1),
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, -1 / 3, -1 / 3, -1.0, 1.0]))


def test_rloo_leave_one_out() -> None:
    adv, _ = compute_advantages(
        cfg=cfg(advantage="rloo", adv_std_norm="none"),
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0]),
        group_ids=torch.tensor([0, 0, 0, 0, 1]),
        mask=torch.ones(5, 2),
    )
    # 1 - (0 + 1 + 0) / 3 = 2/3 ; 0 - (1 + 1 + 0) / 3 = -2/3 ; a group of one has no baseline -> 0
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, -2 / 3, 2 / 3, -2 / 3, 0.0]))


def test_reinforce_raw_and_batch_normalised() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    ids = torch.tensor([0, 1, 2, 3])
    raw, _ = compute_advantages(
        cfg=cfg(advantage="reinforce", adv_std_norm="none"), rewards=rewards, group_ids=ids, mask=ONES
    )
    torch.testing.assert_close(raw[:, 0], rewards)
    norm, _ = compute_advantages(
        cfg=cfg(advantage="reinforce", adv_std_norm="batch"), rewards=rewards, group_ids=ids, mask=ONES
    )
    torch.testing.assert_close(norm[:, 0], torch.tensor([0.866024, -0.866024, 0.866024, -0.866024]), atol=1e-5, rtol=0)


def test_opo_length_weighted_baseline() -> None:
    # lengths [1, 3]: b = (1 * 1 + 3 * 0) / 4 = .25 -> [.75, -.25]
    mask = t([1, 0, 0], [1, 1, 1])
    adv, _ = compute_advantages(
        cfg=cfg(advantage="opo", adv_std_norm="none"),
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        mask=mask,
    )
    torch.testing.assert_close(adv, t([0.75, 0, 0], [-0.25, -0.25, -0.25]))


def test_raft_positive_only() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.7, 0.5])
    adv, _ = compute_advantages(
        cfg=cfg(advantage="raft", adv_std_norm="none", raft_threshold=0.5),
        rewards=rewards,
        group_ids=torch.zeros(4, dtype=torch.long),
        mask=ONES,
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert raft_mask(rewards, threshold=0.5).tolist() == [True, False, True, False]


def test_gae_hand_example() -> None:
    # token rewards [0, 1] (reward on the last valid token), V = [.5, .25], gamma 1, lam .5:
    # t=1: delta = 1 - .25 = .75, A = .75 ; t=0: delta = .25 - .5 = -.25, A = -.25 + .5 * .75 = .125
    mask = t([1, 1, 0])
    values = t([0.5, 0.25, 9.0])
    adv, returns = compute_advantages(
        cfg=cfg(advantage="gae", gamma=1.0, lam=0.5, critic=True),
        rewards=torch.tensor([1.0]),
        group_ids=torch.tensor([0]),
        mask=mask,
        values=values,
    )
    torch.testing.assert_close(adv, t([0.125, 0.75, 0]))
    torch.testing.assert_close(returns, t([0.625, 1.0, 0]))
    # gamma .5, lam 1: t=0: delta = .5 * .25 - .5 = -.375, A = -.375 + .5 * .75 = 0
    adv2, _ = gae_advantages(t([0, 1, 0]), values, mask, gamma=0.5, lam=1.0)
    torch.testing.assert_close(adv2, t([0.0, 0.75, 0]))


def test_gae_skips_holes_in_the_mask() -> None:
    # a masked middle token is skipped: same as the dense sequence [a, c]
    holey, _ = gae_advantages(t([0, 0, 1]), t([0.5, 7.0, 0.25]), t([1, 0, 1]), gamma=1.0, lam=0.5)
    dense, _ = gae_advantages(t([0, 1]), t([0.5, 0.25]), t([1, 1]), gamma=1.0, lam=0.5)
    torch.testing.assert_close(holey[:, [0, 2]], dense)
    assert holey[0, 1] == 0


def test_gae_needs_values() -> None:
    with pytest.raises(ValueError, match="values"):
        compute_advantages(cfg=cfg(advantage="gae"), rewards=torch.ones(1), group_ids=torch.zeros(1), mask=t([1]))


def test_reinforce_pp_token_kl_and_return_to_go() -> None:
    # kl .1 on valid tokens, coef .5 -> -.05 per token, + reward on the last valid token; gamma 1
    mask = t([1, 1, 1], [1, 1, 0])
    kl = torch.full((2, 3), 0.1)
    adv, returns = compute_advantages(
        cfg=cfg(advantage="reinforce_pp", adv_std_norm="none", kl_in="reward", kl_coef=0.5, gamma=1.0),
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        mask=mask,
        kl=kl,
    )
    expected = t([0.85, 0.9, 0.95], [-0.1, -0.05, 0.0])
    torch.testing.assert_close(returns, expected)
    torch.testing.assert_close(adv, expected)
    # kl_coef argument overrides cfg (an adaptive controller's value): coef 0 -> plain returns
    _, plain = compute_advantages(
        cfg=cfg(advantage="reinforce_pp", adv_std_norm="none", kl_in="reward", kl_coef=0.5),
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        mask=mask,
        kl=kl,
        kl_coef=0.0,
    )
    torch.testing.assert_close(plain, t([1, 1, 1], [0, 0, 0]))


def test_reinforce_pp_gamma_discounts() -> None:
    returns = discounted_returns(t([-0.05, -0.05, 0.95]), t([1, 1, 1]), gamma=0.5)
    # t2 = .95 ; t1 = -.05 + .475 = .425 ; t0 = -.05 + .2125 = .1625
    torch.testing.assert_close(returns, t([0.1625, 0.425, 0.95]))


def test_reinforce_pp_baseline_group_mean_then_batch_whitening() -> None:
    # group mean .5 -> tokens [.5, .5, .5, -.5, -.5]; token mean .1, sample std sqrt(1.2 / 4) = .547723
    mask = t([1, 1, 1], [1, 1, 0])
    adv, _ = compute_advantages(
        cfg=cfg(advantage="reinforce_pp_baseline", adv_std_norm="batch"),
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        mask=mask,
    )
    torch.testing.assert_close(adv, t([0.730297, 0.730297, 0.730297], [-1.095445, -1.095445, 0]), atol=1e-5, rtol=0)


def test_reinforce_pp_rejects_group_std() -> None:
    with pytest.raises(ValueError, match="batch or none"):
        compute_advantages(
            cfg=cfg(advantage="reinforce_pp", adv_std_norm="group"),
            rewards=torch.ones(2),
            group_ids=torch.zeros(2),
            mask=torch.ones(2, 2),
        )


def test_sequence_level_kl_in_reward() -> None:
    # r' = r - coef * sum_t kl: [1 - .2, 1 - 0] = [.8, 1] -> dr_grpo: [-.1, .1]
    adv, _ = compute_advantages(
        cfg=cfg(advantage="dr_grpo", kl_in="reward", kl_coef=1.0),
        rewards=torch.tensor([1.0, 1.0]),
        group_ids=torch.tensor([0, 0]),
        mask=torch.ones(2, 2),
        kl=t([0.1, 0.1], [0.0, 0.0]),
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([-0.1, 0.1]))
    with pytest.raises(ValueError, match="kl"):
        compute_advantages(
            cfg=cfg(advantage="grpo", kl_in="reward", kl_coef=1.0),
            rewards=torch.ones(2),
            group_ids=torch.zeros(2),
            mask=torch.ones(2, 2),
        )


def test_adv_clip_and_whiten() -> None:
    adv, _ = compute_advantages(
        cfg=cfg(advantage="grpo", adv_clip=0.5),
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]),
        group_ids=torch.zeros(4, dtype=torch.long),
        mask=ONES,
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, 0.5, -0.5]))
    mask = t([1, 1, 0], [1, 0, 0], [1, 1, 1])
    white, _ = compute_advantages(
        cfg=cfg(advantage="reinforce", adv_std_norm="none", adv_whiten=True),
        rewards=torch.tensor([3.0, 1.0, 0.0]),
        group_ids=torch.tensor([0, 1, 2]),
        mask=mask,
    )
    valid = white[mask.bool()]
    assert abs(valid.mean().item()) < 1e-6 and abs(valid.std().item() - 1.0) < 1e-5
    assert white[~mask.bool()].abs().sum() == 0


def test_last_token_onehot_handles_empty_rows() -> None:
    torch.testing.assert_close(
        last_token_onehot(t([1, 1, 0], [0, 0, 0], [1, 1, 1])), t([0, 1, 0], [0, 0, 0], [0, 0, 1])
    )


@settings(max_examples=40, deadline=None)
@given(
    rewards=st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=2, max_size=12),
    n_groups=st.integers(1, 4),
    scale=st.floats(0.1, 10),
    shift=st.floats(-3, 3),
)
def test_grpo_properties(rewards: list[float], n_groups: int, scale: float, shift: float) -> None:
    r = torch.tensor(rewards, dtype=torch.float64)
    ids = torch.arange(len(rewards)) % n_groups
    adv = normalize_rewards_per_group(r, ids, std_norm="group", eps=1e-12)
    assert torch.isfinite(adv).all()
    spread = group_std(r, ids)
    for g in range(n_groups):
        in_group = ids == g
        assert abs(adv[in_group].sum().item()) < 1e-6  # centred per group
    # invariant to an affine change of the reward scale (where the group has real variance)
    adv2 = normalize_rewards_per_group(r * scale + shift, ids, std_norm="group", eps=1e-12)
    spread_ok = spread > 1e-3
    torch.testing.assert_close(adv[spread_ok], adv2[spread_ok], atol=1e-6, rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=40), st.integers(1, 39))
def test_running_moments_match_batch_and_resume_exactly(xs: list[float], cut: int) -> None:
    cut = min(cut, len(xs))
    full = RunningMoments()
    full.update(xs)
    a = RunningMoments()
    a.update(xs[:cut])
    b = RunningMoments()
    b.load_state_dict(a.state_dict())
    a.update(xs[cut:])
    b.update(xs[cut:])
    assert a.state_dict() == b.state_dict()  # resume is bit-exact
    mean = math.fsum(xs) / len(xs)
    assert math.isclose(full.mean, mean, rel_tol=1e-9, abs_tol=1e-9)
    if len(xs) > 1:
        var = math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
        assert math.isclose(a.var, var, rel_tol=1e-7, abs_tol=1e-7)


def test_running_moments_hand_example() -> None:
    rm = RunningMoments()
    rm.update(torch.tensor([1.0, 2.0, 3.0]))
    assert rm.mean == 2.0 and rm.var == 1.0
    torch.testing.assert_close(rm.normalize(torch.tensor([3.0]), eps=0.0), torch.tensor([1.0]))
    rm.update([4.0])
    assert rm.mean == 2.5 and math.isclose(rm.var, 5 / 3)


def test_masked_whiten_ignores_padding() -> None:
    x = t([1.0, 3.0, 100.0])
    out = masked_whiten(x, t([1, 1, 0]), eps=0.0)
    # mean 2, sample std sqrt(2) -> [-.707107, .707107, 0]
    torch.testing.assert_close(out, t([-0.707107, 0.707107, 0.0]), atol=1e-6, rtol=0)


def test_discounted_returns_skip_masked_tokens() -> None:
    # the masked middle token's reward is ignored and the hole is skipped by the discount
    rewards, mask = t([1.0, 5.0, 2.0]), t([1, 0, 1])
    torch.testing.assert_close(discounted_returns(rewards, mask, gamma=1.0), t([3.0, 0.0, 2.0]))
    torch.testing.assert_close(discounted_returns(rewards, mask, gamma=0.5), t([2.0, 0.0, 2.0]))


def test_package_import_is_torch_free() -> None:
    import subprocess
    import sys

    code = "import sys, rlvr.algorithms, rlvr.algorithms.filters; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
