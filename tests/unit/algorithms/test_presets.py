"""Every preset resolves to a valid config, matches its paper's numbers, and runs end to end."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algorithms.advantages import compute_advantages, raft_mask
from rlvr.algorithms.kl import kl_penalty, make_kl_controller
from rlvr.algorithms.losses import compute_policy_loss, compute_value_loss, loss_denominators
from rlvr.recipe.presets import PRESETS
from rlvr.recipe.schema import AlgorithmConfig


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_runs_end_to_end(name: str) -> None:
    c = AlgorithmConfig(preset=name)
    gen = torch.Generator().manual_seed(0)
    batch, horizon = 6, 5
    lengths = torch.tensor([5, 3, 4, 1, 5, 2])
    mask = (torch.arange(horizon).unsqueeze(0) < lengths.unsqueeze(1)).float()
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2])
    old = -torch.rand(batch, horizon, generator=gen) - 0.1
    ref = old - 0.05 * torch.randn(batch, horizon, generator=gen)
    rollout = old + 0.05 * torch.randn(batch, horizon, generator=gen)
    values = torch.randn(batch, horizon, generator=gen)
    kl_ctl = make_kl_controller(c)

    adv, returns = compute_advantages(
        cfg=c,
        rewards=rewards,
        group_ids=group_ids,
        mask=mask,
        values=values if c.critic else None,
        kl=kl_penalty(old, ref, estimator=str(c.kl_estimator)),
        kl_coef=kl_ctl.value,
    )
    assert adv.shape == returns.shape == (batch, horizon)
    assert torch.isfinite(adv).all() and torch.isfinite(returns).all()
    assert adv[~mask.bool()].abs().sum() == 0
    if c.advantage == "raft":
        mask = mask * raft_mask(rewards, threshold=float(c.raft_threshold or 0.0)).unsqueeze(-1)
    num_tokens, num_seqs = loss_denominators(mask)

    for perturb in (0.0, 0.3):  # on-policy first mini-batch, then an off-policy one
        lp = (old + perturb * torch.randn(batch, horizon, generator=gen)).requires_grad_(True)
        loss, metrics = compute_policy_loss(
            cfg=c,
            logprobs=lp,
            old_logprobs=old,
            advantages=adv,
            mask=mask,
            ref_logprobs=ref,
            rollout_logprobs=rollout,
            entropy=torch.rand(batch, horizon, generator=gen),
            kl_coef=kl_ctl.value,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_len=8,
        )
        assert torch.isfinite(loss)
        assert all(math.isfinite(v) for v in metrics.values())
        (grad,) = torch.autograd.grad(loss, lp)
        assert torch.isfinite(grad).all()
        assert grad[~mask.bool()].abs().sum() == 0
        if perturb == 0.0:
            assert grad.abs().sum() > 0, f"{name}: no gradient on-policy"

    if c.critic:
        v = values.clone().requires_grad_(True)
        vloss, _ = compute_value_loss(
            values=v,
            old_values=values,
            returns=returns,
            mask=mask,
            value_clip=float(c.value_clip or 0.0),
            mode=str(c.loss_agg),
        )
        vloss.backward()
        assert v.grad is not None and torch.isfinite(v.grad).all()


def test_presets_carry_their_papers_numbers() -> None:
    grpo = AlgorithmConfig(preset="grpo")
    assert (grpo.kl_coef, grpo.kl_estimator, grpo.kl_in, grpo.loss_agg) == (0.04, "k3", "loss", "seq-mean-token-mean")
    gspo = AlgorithmConfig(preset="gspo")
    assert (gspo.clip_ratio_low, gspo.clip_ratio_high, gspo.importance_level) == (3e-4, 4e-4, "sequence")
    dapo = AlgorithmConfig(preset="dapo")
    assert (dapo.clip_ratio_low, dapo.clip_ratio_high, dapo.loss_agg, dapo.dynamic_sampling) == (
        0.2,
        0.28,
        "token-mean",
        True,
    )
    assert dapo.kl_in == "none" and (dapo.overlong_buffer or 0) > 0
    cispo = AlgorithmConfig(preset="cispo")
    assert (cispo.clip_ratio_low, cispo.loss_agg, cispo.kl_in) == (1.0, "token-mean", "none")
    lite = AlgorithmConfig(preset="lite_ppo")
    assert (lite.advantage, lite.adv_std_norm, lite.loss_agg, lite.policy_loss) == (
        "grpo",
        "batch",
        "token-mean",
        "ppo_clip",
    )
    dr = AlgorithmConfig(preset="dr_grpo")
    assert (dr.adv_std_norm, dr.loss_agg, dr.kl_in) == ("none", "seq-mean-token-sum-norm", "none")
    rpp = AlgorithmConfig(preset="reinforce++")
    assert (rpp.kl_in, rpp.kl_estimator, rpp.adv_std_norm) == ("reward", "k1", "batch")
    rppb = AlgorithmConfig(preset="reinforce++_baseline")
    assert (rppb.kl_in, rppb.kl_estimator) == ("loss", "k2")
    ppo = AlgorithmConfig(preset="ppo")
    assert (ppo.advantage, ppo.lam, ppo.critic, ppo.kl_in, ppo.kl_coef) == ("gae", 0.95, True, "reward", 0.02)
    assert AlgorithmConfig(preset="rloo").policy_loss == "vanilla"
    assert AlgorithmConfig(preset="topr").policy_loss == "topr"
    assert AlgorithmConfig(preset="raft++").advantage == "raft"


def test_new_group_mean_knobs_default_off() -> None:
    c = AlgorithmConfig(preset="grpo")
    assert c.min_group_mean is None and c.max_group_mean is None
    assert AlgorithmConfig(preset="grpo", max_group_mean=0.99).max_group_mean == 0.99


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_knob_is_a_plain_value_from_the_preset_table(name: str) -> None:
    """Presets apply before validation: no knob is left None for call sites to default (and
    disagree with the table, as a `kl_estimator or "k1"` once did)."""
    from rlvr.recipe.presets import BASE, resolve_algorithm

    c = AlgorithmConfig(preset=name)
    assert c.model_dump(exclude={"preset"}) == pytest.approx(resolve_algorithm(name, {}))
    assert set(c.model_dump(exclude={"preset"})) == set(BASE)
    assert AlgorithmConfig(preset=name, kl_estimator="abs").kl_estimator == "abs"  # the recipe still wins


def test_an_epoch_count_of_zero_is_rejected() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="ppo_epochs"):
        AlgorithmConfig(ppo_epochs=0)
