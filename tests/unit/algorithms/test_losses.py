"""Loss aggregation (with its micro-batch invariant) and every policy loss's clipping behaviour."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithms.losses import (
    LOSS_AGG_MODES,
    aggregate_loss,
    compute_policy_loss,
    compute_value_loss,
    loss_denominators,
)
from tests.unit.algorithms.helpers import cfg

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 sequences
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 6),  # 7 / (2 sequences * T = 3)
    ],
)
def test_aggregation_modes_hand_values(mode: str, expected: float) -> None:
    assert math.isclose(aggregate_loss(LOSS, MASK, mode=mode).item(), expected, rel_tol=1e-6)


def test_aggregation_global_denominators_and_max_len() -> None:
    assert aggregate_loss(LOSS, MASK, mode="token-mean", num_tokens=7).item() == 1.0
    assert aggregate_loss(LOSS, MASK, mode="seq-mean-token-sum", num_seqs=7).item() == 1.0
    assert aggregate_loss(LOSS, MASK, mode="seq-mean-token-sum-norm", max_len=4).item() == 0.875  # 7 / (2 * 4)
    assert loss_denominators(torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])) == (3.0, 2.0)


def test_aggregation_ignores_garbage_on_padding_and_empty_batches() -> None:
    loss = LOSS.clone()
    loss[0, 2] = float("nan")
    loss[1, 1] = float("inf")
    for mode in LOSS_AGG_MODES:
        assert torch.isfinite(aggregate_loss(loss, MASK, mode=mode))
        assert aggregate_loss(loss, torch.zeros_like(MASK), mode=mode).item() == 0.0
    with pytest.raises(ValueError, match="unknown loss_agg"):
        aggregate_loss(LOSS, MASK, mode="sum")


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 7),
    horizon=st.integers(1, 9),
    cuts=st.lists(st.integers(1, 6), max_size=4),
    mode=st.sampled_from(LOSS_AGG_MODES),
)
def test_micro_batches_with_global_denominators_equal_full_batch(
    seed: int, batch: int, horizon: int, cuts: list[int], mode: str
) -> None:
    """Split rows into micro-batches, trim each to its own longest sequence (as a packing /
    dynamic-batching trainer would), pass the full batch's denominators: the summed losses and
    gradients equal the full batch's."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, horizon + 1, (batch,), generator=gen)
    mask = (torch.arange(horizon).unsqueeze(0) < lengths.unsqueeze(1)).double()
    weights = torch.randn(batch, horizon, generator=gen, dtype=torch.float64)
    theta = torch.randn(batch, horizon, generator=gen, dtype=torch.float64, requires_grad=True)
    max_len = horizon + 3
    num_tokens, num_seqs = loss_denominators(mask)

    full = aggregate_loss(theta.square() * weights, mask, mode=mode, max_len=max_len)
    (full_grad,) = torch.autograd.grad(full, theta)

    bounds = sorted({0, batch, *[c for c in cuts if c < batch]})
    total = torch.zeros((), dtype=torch.float64)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        width = max(int(lengths[lo:hi].max().item()), 1)
        part = theta[lo:hi, :width].square() * weights[lo:hi, :width]
        total = total + aggregate_loss(
            part, mask[lo:hi, :width], mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len
        )
    (split_grad,) = torch.autograd.grad(total, theta)
    torch.testing.assert_close(total, full.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(split_grad, full_grad, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- policy losses


def one_token_batch(ratios: list[float], advantages: list[float], old: float = -1.0):
    """B sequences of one token each, with pi/pi_old = ratios."""
    old_lp = torch.full((len(ratios), 1), old)
    lp = (old_lp + torch.tensor(ratios).log().unsqueeze(-1)).requires_grad_(True)
    adv = torch.tensor(advantages).unsqueeze(-1)
    return lp, old_lp, adv, torch.ones(len(ratios), 1)


def grad_of(loss: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, lp)
    return g.squeeze(-1)


def test_ppo_clip_higher_zero_gradient_where_clipped() -> None:
    # (A, r): (1, 1.5) clipped at 1.28 -> -1.28, grad 0 ; (1, .5) -> max(-.5, -.8) = -.5, grad -r = -.5
    # (-1, .5) -> max(.5, .8) = .8, grad 0 ; (-1, 1.5) -> max(1.5, 1.2) = 1.5, grad +1.5 ; all / 4 tokens
    lp, old, adv, mask = one_token_batch([1.5, 0.5, 0.5, 1.5], [1.0, 1.0, -1.0, -1.0])
    c = cfg(policy_loss="ppo_clip", clip_ratio_low=0.2, clip_ratio_high=0.28)
    loss, metrics = compute_policy_loss(cfg=c, logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
    assert math.isclose(loss.item(), (-1.28 - 0.5 + 0.8 + 1.5) / 4, rel_tol=1e-5)
    torch.testing.assert_close(grad_of(loss, lp), torch.tensor([0.0, -0.5, 0.0, 1.5]) / 4)
    assert metrics["clip_frac"] == 0.5 and metrics["dual_clip_frac"] == 0.0
    assert math.isclose(metrics["ratio_max"], 1.5, rel_tol=1e-6)
    assert math.isclose(metrics["ratio_mean"], 1.0, rel_tol=1e-6)


def test_dual_clip_caps_negative_advantages() -> None:
    # A = -1: r = 4 -> min(max(4, 1.2), 3) = 3 (grad 0, dual-clipped) ; r = 2 -> 2 (grad 2)
    lp, old, adv, mask = one_token_batch([4.0, 2.0], [-1.0, -1.0])
    c = cfg(policy_loss="ppo_clip", dual_clip_c=3.0)
    loss, metrics = compute_policy_loss(cfg=c, logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
    assert math.isclose(loss.item(), 2.5, rel_tol=1e-5)
    torch.testing.assert_close(grad_of(loss, lp), torch.tensor([0.0, 1.0]))
    assert metrics["dual_clip_frac"] == 0.5


def test_gspo_sequence_ratio_straight_through() -> None:
    # log r = [.2, -.1] -> s = exp(.05) = 1.051271 on both tokens
    old = torch.zeros(1, 2)
    lp = torch.tensor([[0.2, -0.1]], requires_grad=True)
    mask = torch.ones(1, 2)
    c = cfg(policy_loss="gspo", importance_level="sequence", clip_ratio_low=3e-4, clip_ratio_high=4e-4,
            loss_agg="seq-mean-token-mean")  # fmt: skip
    # A = +1: s > 1 + 4e-4 -> clipped, loss -1.0004, no gradient
    loss, metrics = compute_policy_loss(cfg=c, logprobs=lp, old_logprobs=old, advantages=torch.ones(1, 2), mask=mask)
    assert math.isclose(loss.item(), -1.0004, rel_tol=1e-6) and metrics["clip_frac"] == 1.0
    torch.testing.assert_close(grad_of(loss, lp), torch.zeros(1, 2).squeeze(-1))
    assert math.isclose(metrics["ratio_mean"], 1.051271, rel_tol=1e-6)
    # A = -1: unclipped branch; grad = s / |y| on EVERY token (token-level ratios would differ)
    loss, _ = compute_policy_loss(cfg=c, logprobs=lp, old_logprobs=old, advantages=-torch.ones(1, 2), mask=mask)
    assert math.isclose(loss.item(), 1.051271, rel_tol=1e-6)
    torch.testing.assert_close(grad_of(loss, lp), torch.tensor([[0.5256355, 0.5256355]]).squeeze(-1))
    # ppo_clip with importance_level = "sequence" is the same loss
    c2 = cfg(**{**vars(c), "policy_loss": "ppo_clip"})
    loss2, _ = compute_policy_loss(cfg=c2, logprobs=lp, old_logprobs=old, advantages=-torch.ones(1, 2), mask=mask)
    assert loss2.item() == loss.item()


def test_gspo_padding_does_not_enter_the_sequence_ratio() -> None:
    old = torch.zeros(1, 3)
    lp = torch.tensor([[0.2, -0.1, 50.0]], requires_grad=True)
    c = cfg(policy_loss="gspo", clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg="seq-mean-token-mean")
    _, metrics = compute_policy_loss(
        cfg=c, logprobs=lp, old_logprobs=old, advantages=-torch.ones(1, 3), mask=torch.tensor([[1.0, 1.0, 0.0]])
    )
    assert math.isclose(metrics["ratio_max"], 1.051271, rel_tol=1e-6)


def test_cispo_keeps_gradient_on_clipped_tokens() -> None:
    # A = 1, r = 1.5: weight clipped to 1.28 but the gradient is -1.28 (PPO would give 0)
    # A = -1, r = .1 with eps_low = 1 (lower bound 0): weight .1, grad +.1
    lp, old, adv, mask = one_token_batch([1.5, 0.1], [1.0, -1.0])
    c = cfg(policy_loss="cispo", clip_ratio_low=1.0, clip_ratio_high=0.28)
    loss, metrics = compute_policy_loss(cfg=c, logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
    torch.testing.assert_close(grad_of(loss, lp), torch.tensor([-1.28, 0.1]) / 2)
    # value: -(1.28 * 1 * (-1 + log 1.5)) and -(.1 * -1 * (-1 + log .1)), mean of the two
    expected = (-1.28 * (-1 + math.log(1.5)) + 0.1 * (-1 + math.log(0.1))) / 2
    assert math.isclose(loss.item(), expected, rel_tol=1e-5)
    assert metrics["clip_frac"] == 0.5


def test_topr_positive_and_negative_branches() -> None:
    # A = 2, r = 3: no ratio -> grad -2 ; A = -1, r = 3: weight clip(3, 0, 1) = 1 -> +1 ; A = -1, r = .5: +.5
    lp, old, adv, mask = one_token_batch([3.0, 3.0, 0.5], [2.0, -1.0, -1.0])
    c = cfg(policy_loss="topr", loss_agg="seq-mean-token-sum")
    loss, metrics = compute_policy_loss(cfg=c, logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
    torch.testing.assert_close(grad_of(loss, lp), torch.tensor([-2.0, 1.0, 0.5]) / 3)
    assert math.isclose(metrics["clip_frac"], 1 / 3, rel_tol=1e-6)


def test_vanilla_and_tis() -> None:
    lp, old, adv, mask = one_token_batch([3.0, 0.5], [1.0, 2.0])
    loss, _ = compute_policy_loss(
        cfg=cfg(policy_loss="vanilla"), logprobs=lp, old_logprobs=old, advantages=adv, mask=mask
    )
    torch.testing.assert_close(grad_of(loss, lp), torch.tensor([-1.0, -2.0]) / 2)
    # tis, cap 2: weights min(3, 2) = 2 and .5 -> grads -2 * 1 and -.5 * 2
    loss, metrics = compute_policy_loss(
        cfg=cfg(policy_loss="tis", tis_cap=2.0), logprobs=lp, old_logprobs=old, advantages=adv, mask=mask
    )
    torch.testing.assert_close(grad_of(loss, lp), torch.tensor([-2.0, -1.0]) / 2)
    assert metrics["clip_frac"] == 0.5


def test_rollout_correction_weight() -> None:
    # on-policy w.r.t. the trainer (r = 1), but pi_old / pi_rollout = [3, .5] -> weights [min(3, 2), .5]
    lp, old, adv, mask = one_token_batch([1.0, 1.0], [1.0, 1.0])
    rollout = old - torch.tensor([[math.log(3.0)], [math.log(0.5)]])
    c = cfg(policy_loss="ppo_clip", tis_cap=2.0)
    loss, metrics = compute_policy_loss(
        cfg=c, logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, rollout_logprobs=rollout
    )
    torch.testing.assert_close(grad_of(loss, lp), torch.tensor([-2.0, -0.5]) / 2)
    assert math.isclose(metrics["tis_weight_mean"], 1.25, rel_tol=1e-5) and metrics["tis_clip_frac"] == 0.5
    # tis_cap = 0: no correction even with rollout log-probs
    loss0, _ = compute_policy_loss(
        cfg=cfg(policy_loss="ppo_clip"),
        logprobs=lp,
        old_logprobs=old,
        advantages=adv,
        mask=mask,
        rollout_logprobs=rollout,
    )
    torch.testing.assert_close(grad_of(loss0, lp), torch.tensor([-0.5, -0.5]))


def test_kl_in_loss_and_entropy_bonus() -> None:
    lp, old, _, mask = one_token_batch([1.0], [0.0])
    ref = old.detach() - 0.2  # log pi - log ref = .2
    zero = torch.zeros(1, 1)
    c = cfg(kl_in="loss", kl_coef=0.5, kl_estimator="k1")
    loss, metrics = compute_policy_loss(
        cfg=c, logprobs=lp, old_logprobs=old, advantages=zero, mask=mask, ref_logprobs=ref
    )
    assert math.isclose(loss.item(), 0.1, rel_tol=1e-5) and math.isclose(metrics["kl"], 0.2, rel_tol=1e-5)
    torch.testing.assert_close(grad_of(loss, lp), torch.tensor([0.5]))
    loss, _ = compute_policy_loss(
        cfg=c, logprobs=lp, old_logprobs=old, advantages=zero, mask=mask, ref_logprobs=ref, kl_coef=1.0
    )
    assert math.isclose(loss.item(), 0.2, rel_tol=1e-5)  # the controller's value wins
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_policy_loss(cfg=c, logprobs=lp, old_logprobs=old, advantages=zero, mask=mask)
    ent = cfg(entropy_coef=0.1)
    loss, metrics = compute_policy_loss(
        cfg=ent, logprobs=lp, old_logprobs=old, advantages=zero, mask=mask, entropy=torch.full((1, 1), 2.0)
    )
    assert math.isclose(loss.item(), -0.2, rel_tol=1e-6) and metrics["entropy"] == 2.0
    with pytest.raises(ValueError, match="entropy"):
        compute_policy_loss(cfg=ent, logprobs=lp, old_logprobs=old, advantages=zero, mask=mask)


def test_metrics_are_floats_and_approx_kl_nonnegative() -> None:
    lp, old, adv, mask = one_token_batch([1.3, 0.7, 1.0], [1.0, -1.0, 0.5])
    _, metrics = compute_policy_loss(cfg=cfg(), logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
    assert all(isinstance(v, float) for v in metrics.values())
    # k3(r) = r^-1 ... per token: exp(old - lp) - (old - lp) - 1 with r = exp(lp - old)
    expected = sum(1 / r + math.log(r) - 1 for r in (1.3, 0.7, 1.0)) / 3
    assert math.isclose(metrics["approx_kl"], expected, rel_tol=1e-5)
    assert {"pg_loss", "clip_frac", "approx_kl", "ratio_mean", "ratio_max", "dual_clip_frac"} <= set(metrics)


@settings(max_examples=80, deadline=None)
@given(
    log_ratio=st.floats(-3, 3),
    advantage=st.floats(-5, 5).filter(lambda a: abs(a) > 1e-3),
    low=st.floats(0.01, 0.5),
    high=st.floats(0.01, 0.5),
)
def test_ppo_clip_properties(log_ratio: float, advantage: float, low: float, high: float) -> None:
    """The clipped objective is a pessimistic bound, and a clipped token has zero gradient."""
    lp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    adv = torch.tensor([[advantage]], dtype=torch.float64)
    c = cfg(policy_loss="ppo_clip", clip_ratio_low=low, clip_ratio_high=high)
    loss, metrics = compute_policy_loss(cfg=c, logprobs=lp, old_logprobs=old, advantages=adv, mask=torch.ones(1, 1))
    ratio = math.exp(log_ratio)
    clipped_ratio = min(max(ratio, 1 - low), 1 + high)
    assert -loss.item() <= advantage * ratio + 1e-9
    assert -loss.item() <= advantage * clipped_ratio + 1e-9
    (g,) = torch.autograd.grad(loss, lp)
    if metrics["clip_frac"] == 1.0:
        assert g.item() == 0.0
    else:
        assert math.isclose(g.item(), -advantage * ratio, rel_tol=1e-9)


# --------------------------------------------------------------------------- value loss


def test_value_loss_clipping() -> None:
    # V 1.5, old 1, R 2, clip .2: V_clip = 1.2 -> .5 * max(.25, .64) = .32, grad 0
    # V 1.1: inside -> .5 * .81 = .405, grad V - R = -.9 ; token-mean over 2
    values = torch.tensor([[1.5], [1.1]], requires_grad=True)
    loss, metrics = compute_value_loss(
        values=values,
        old_values=torch.ones(2, 1),
        returns=torch.full((2, 1), 2.0),
        mask=torch.ones(2, 1),
        value_clip=0.2,
        mode="token-mean",
    )
    assert math.isclose(loss.item(), (0.32 + 0.405) / 2, rel_tol=1e-6)
    (g,) = torch.autograd.grad(loss, values)
    torch.testing.assert_close(g, torch.tensor([[0.0], [-0.45]]))
    assert metrics["vf_clip_frac"] == 0.5
    unclipped, _ = compute_value_loss(
        values=values.detach(),
        old_values=torch.ones(2, 1),
        returns=torch.full((2, 1), 2.0),
        mask=torch.ones(2, 1),
        value_clip=0.0,
        mode="token-mean",
    )
    assert math.isclose(unclipped.item(), (0.125 + 0.405) / 2, rel_tol=1e-6)


@pytest.mark.parametrize("policy_loss", ["ppo_clip", "gspo", "cispo", "topr", "vanilla", "tis"])
def test_off_policy_weights_stay_finite_and_masked_tokens_contribute_nothing(policy_loss: str) -> None:
    """Stale samples can be far off: log-ratios of +-1000 or inf must give finite losses and
    gradients, and a masked token (padding, overlong, a future tool-output token) exactly 0."""
    lp = torch.tensor([[-0.5, -2.0, -0.1, 0.0], [-1.0, -3.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1000.0, -0.1, 5.0, -math.inf], [-1.0, 1000.0, math.inf, 0.0]])
    rollout = torch.tensor([[0.0, -1000.0, -math.inf, math.nan], [-math.inf, -1.0, 0.0, math.nan]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1e6, math.nan], [-1.0, -1.0, 1e6, math.nan]])
    c = cfg(policy_loss=policy_loss, tis_cap=2.0)
    loss, metrics = compute_policy_loss(
        cfg=c, logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, rollout_logprobs=rollout
    )
    loss.backward()
    assert lp.grad is not None and torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert (lp.grad[mask == 0] == 0).all()
    assert all(math.isfinite(v) for v in metrics.values()) and metrics["tis_weight_mean"] <= 2.0


@pytest.mark.parametrize("policy_loss", ["ppo_clip", "cispo", "tis"])
def test_is_correction_with_pi_old_equal_to_pi_rollout_is_the_on_policy_gradient(policy_loss: str) -> None:
    torch.manual_seed(0)
    lp = torch.randn(3, 5).clamp(max=0)
    old = lp + 0.1 * torch.randn(3, 5)
    adv = torch.randn(3, 5)
    mask = (torch.rand(3, 5) > 0.2).float()
    grads = []
    for rollout in (None, old.clone()):
        x = lp.clone().requires_grad_(True)
        loss, metrics = compute_policy_loss(
            cfg=cfg(policy_loss=policy_loss, tis_cap=2.0), logprobs=x, old_logprobs=old, advantages=adv, mask=mask,
            rollout_logprobs=rollout,
        )  # fmt: skip
        grads.append(grad_of(loss, x))
        if rollout is not None:
            assert metrics["mismatch_kl"] == 0.0 and math.isclose(metrics["tis_weight_mean"], 1.0)
    torch.testing.assert_close(grads[0], grads[1])
