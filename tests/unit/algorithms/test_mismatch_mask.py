"""Rollout/trainer mismatch masking: tokens or whole sequences whose pi_old / pi_rollout leaves the
band lose their policy gradient, checked against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algorithms.losses import compute_policy_loss, mismatch_keep
from rlvr.recipe.schema import AlgorithmConfig

L = math.log
# two sequences of three tokens; the second has one padding position
GAP = torch.tensor([[L(1.0), L(3.0), L(0.9)], [L(1.5), L(1.5), 0.0]])
VALID = torch.tensor([[True, True, True], [True, True, False]])


def test_token_mode_keeps_each_token_inside_the_band() -> None:
    keep = mismatch_keep(GAP, VALID, mode="token", low=0.5, high=2.0)
    assert keep.tolist() == [[True, False, True], [True, True, False]]  # 3.0 is out; padding never kept


def test_sequence_mode_judges_the_product_of_the_ratios() -> None:
    # sequence 1: 1 * 3 * 0.9 = 2.7 (out of [0.5, 2]); sequence 2: 1.5 * 1.5 = 2.25 (out)
    assert mismatch_keep(GAP, VALID, mode="sequence", low=0.5, high=2.0).tolist() == [[False] * 3, [False] * 3]
    # with a band to 2.5 the second sequence is in, its padding still not
    assert mismatch_keep(GAP, VALID, mode="sequence", low=0.5, high=2.5).tolist() == [
        [False, False, False], [True, True, False],
    ]  # fmt: skip


def test_geometric_mode_judges_the_per_token_mean() -> None:
    # geometric means: 2.7 ** (1/3) = 1.392 and 2.25 ** (1/2) = 1.5; a band to 1.45 keeps only the first
    keep = mismatch_keep(GAP, VALID, mode="geometric", low=0.5, high=1.45)
    assert keep.tolist() == [[True, True, True], [False, False, False]]


def test_masked_tokens_carry_no_policy_gradient_and_the_fraction_is_logged() -> None:
    cfg = AlgorithmConfig(preset="grpo", kl_in="none", policy_loss="vanilla", mismatch_mask="token", mismatch_low=0.5,
                          mismatch_high=2.0)  # fmt: skip
    logprobs = torch.full((2, 3), -1.0, requires_grad=True)
    rollout = -1.0 - GAP  # so that old - rollout = GAP
    loss, metrics = compute_policy_loss(
        cfg=cfg, logprobs=logprobs, old_logprobs=torch.full((2, 3), -1.0), advantages=torch.ones(2, 3),
        mask=VALID.float(), rollout_logprobs=rollout,
    )  # fmt: skip
    loss.backward()
    assert logprobs.grad is not None
    assert (logprobs.grad[0, 1] == 0).item() and (logprobs.grad[0, 0] != 0).item()
    assert metrics["mismatch_masked_frac"] == pytest.approx(1 / 5)
    plain = AlgorithmConfig(preset="grpo", kl_in="none", policy_loss="vanilla")
    _, metrics = compute_policy_loss(cfg=plain, logprobs=logprobs.detach(), old_logprobs=torch.full((2, 3), -1.0),
                                     advantages=torch.ones(2, 3), mask=VALID.float(), rollout_logprobs=rollout)  # fmt: skip
    assert "mismatch_masked_frac" not in metrics
