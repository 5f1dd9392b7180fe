"""The off-policy correction where the behaviour policy is known exactly.

A tiny Qwen3 (rlvr.tiny's config) at weights v-1 samples; the trainer is at weights v. With one
update per batch rlvr's pi_old is the training forward's own detached log-probs (decoupled PPO's
proximal policy = the current weights) and the loss weighs each token by min(pi_old /
pi_rollout, tis_cap). Two properties:

1. Unbiased: for one-token responses (where a per-token weight is the whole correction) the
   expected gradient of rlvr's loss over samples of v-1 is the on-policy gradient at v: exactly,
   by enumerating every response, and within 5 standard errors (computed exactly from the
   per-response gradients and the sample count) for a batch of sampled responses. Without the
   correction the same checks fail: they can tell.
2. Decoupled PPO: on the same stale batch of multi-token responses, rlvr's loss and gradient
   equal a reference written from AReaL's paper (Fu et al. 2025, "AReaL: A Large-Scale
   Asynchronous Reinforcement Learning System for Language Reasoning", eq. 5):

       J(theta) = E_{a ~ pi_behav} [ sum_t  pi_prox(a_t) / pi_behav(a_t)
                                      * min(u_t A_t, clip(u_t, 1 - eps, 1 + eps) A_t) ],
       u_t = pi_theta(a_t) / pi_prox(a_t),

   with one update (theta = prox, so the clip is inactive: clip_frac 0 is what decoupled PPO
   gives then) and after the weights moved past prox (later mini-batches: the clip binds).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlvr.algorithms.losses import compute_policy_loss
from tests.unit.algorithms.helpers import cfg

V = 8  # vocabulary: small enough to enumerate every one-token response
EOS = 1


def tiny_policy(seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rlvr.tiny import tiny_config

    config = Qwen3Config(**tiny_config(vocab_size=V, hidden_size=16, layers=1, heads=2, kv_heads=1, max_positions=32))
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def moved(model: torch.nn.Module, *, scale: float, seed: int) -> torch.nn.Module:
    """Weights v from weights v-1: every parameter moved by Gaussian noise (an update's size)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return out


def next_logprobs(model: torch.nn.Module, prompts: torch.Tensor) -> torch.Tensor:
    """log pi(. | prompt) of the first response token, [P, V]."""
    return torch.log_softmax(model(prompts).logits[:, -1].float(), dim=-1)


def response_logprobs(model: torch.nn.Module, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """log pi(y_t | prompt, y_<t) of every response token, [N, T] (prompts [N, Lp])."""
    ids = torch.cat([prompts, responses], dim=1)
    logits = model(ids).logits[:, prompts.shape[1] - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def flat_grad(loss: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params(model), allow_unused=True, retain_graph=True)
    return torch.cat(
        [(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params(model), strict=True)]
    )


def rlvr_loss(
    logprobs: torch.Tensor,
    *,
    behaviour: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    proximal: torch.Tensor | None = None,
    tis_cap: float = 1e6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """rlvr's loss as the actor calls it: pi_old = `proximal`, else the forward's own, detached."""
    return compute_policy_loss(
        cfg=cfg(policy_loss="ppo_clip", tis_cap=tis_cap, loss_agg="token-mean"),
        logprobs=logprobs,
        old_logprobs=logprobs.detach() if proximal is None else proximal,
        advantages=advantages,
        mask=mask,
        rollout_logprobs=behaviour,
    )


# --------------------------------------------------------------------------- 1. unbiased


@pytest.fixture(scope="module")
def bandit():
    """Prompts, weights v-1 and v, the advantage of every (prompt, token), and the per-response
    gradient h[p, y] of rlvr's loss at v for response y sampled by v-1 (so E_b h is the
    corrected gradient's expectation)."""
    torch.manual_seed(1)
    behaviour = tiny_policy(seed=0)
    current = moved(behaviour, scale=0.08, seed=1)
    prompts = torch.randint(2, V, (4, 3))
    advantages = torch.randn(prompts.shape[0], V)
    with torch.no_grad():
        b_logp = next_logprobs(behaviour, prompts)
    per_response = torch.zeros(prompts.shape[0], V, sum(p.numel() for p in params(current)))
    raw = torch.zeros_like(per_response)  # the same without the correction (rollout_logprobs=None)
    for y in range(V):
        logp = next_logprobs(current, prompts)[:, y : y + 1]  # [P, 1]
        for p in range(prompts.shape[0]):
            adv, one = advantages[p, y].view(1, 1), torch.ones(1, 1)
            corrected, _ = rlvr_loss(logp[p : p + 1], behaviour=b_logp[p, y].view(1, 1), advantages=adv, mask=one)
            per_response[p, y] = flat_grad(corrected, current)
            plain, _ = rlvr_loss(logp[p : p + 1], behaviour=None, advantages=adv, mask=one)
            raw[p, y] = flat_grad(plain, current)

    # The on-policy gradient at v of the loss -E_{y ~ pi_v}[A], averaged over prompts.
    pi_v = next_logprobs(current, prompts).exp()
    on_policy = flat_grad(-(pi_v * advantages).sum(-1).mean(), current)
    kl = (b_logp.exp() * (b_logp - next_logprobs(current, prompts).detach())).sum(-1).mean().item()
    return dict(
        behaviour=behaviour,
        current=current,
        prompts=prompts,
        advantages=advantages,
        b_probs=b_logp.exp(),
        b_logp=b_logp,
        per_response=per_response,
        raw=raw,
        on_policy=on_policy,
        kl=kl,
    )


def test_the_two_policies_differ_enough_for_the_correction_to_matter(bandit) -> None:
    assert 0.02 < bandit["kl"] < 1.0  # KL(pi_{v-1} || pi_v) per prompt: a real update, not a huge one


def test_expected_corrected_gradient_is_the_on_policy_gradient_at_v(bandit) -> None:
    """E_{y ~ pi_{v-1}} of rlvr's per-response gradient, by enumeration, equals grad at v exactly."""
    b = bandit["b_probs"].unsqueeze(-1)  # [P, V, 1]
    expected = (b * bandit["per_response"]).sum(1).mean(0)
    on_policy = bandit["on_policy"]
    torch.testing.assert_close(expected, on_policy, rtol=1e-4, atol=1e-6)
    # Uncorrected, the expectation is the gradient of a different objective: the check can tell.
    uncorrected = (b * bandit["raw"]).sum(1).mean(0)
    assert (uncorrected - on_policy).norm() > 0.1 * on_policy.norm()


def test_sampled_batch_gradient_matches_on_policy_gradient_within_its_standard_error(bandit) -> None:
    """Many responses sampled by v-1 in one batch through rlvr's loss (token-mean over the batch):
    every coordinate of the gradient within 5 standard errors of the on-policy one at v, the
    standard error exact from the per-response gradients' variance under pi_{v-1} and N."""
    n = 4000
    prompts, current = bandit["prompts"], bandit["current"]
    num_prompts = prompts.shape[0]
    g = torch.Generator().manual_seed(7)
    samples = torch.multinomial(bandit["b_probs"], n, replacement=True, generator=g)  # [P, n]
    rows = torch.arange(num_prompts).repeat_interleave(n)
    tokens = samples.reshape(-1)

    def batch_gradient(corrected: bool) -> torch.Tensor:
        logp = next_logprobs(current, prompts)[rows, tokens].unsqueeze(-1)  # [P * n, 1]
        behaviour = bandit["b_logp"][rows, tokens].unsqueeze(-1) if corrected else None
        adv = bandit["advantages"][rows, tokens].unsqueeze(-1)
        loss, _ = rlvr_loss(logp, behaviour=behaviour, advantages=adv, mask=torch.ones_like(adv))
        return flat_grad(loss, current)

    b = bandit["b_probs"].unsqueeze(-1)

    def standard_error(per_response: torch.Tensor) -> torch.Tensor:
        mean = (b * per_response).sum(1, keepdim=True)
        var = (b * (per_response - mean).square()).sum(1)  # [P, D], per prompt, per sample
        return (var.sum(0) * n).sqrt() / (num_prompts * n)

    on_policy = bandit["on_policy"]
    se = standard_error(bandit["per_response"])
    z = (batch_gradient(True) - on_policy).abs() / (se + 1e-9)
    assert z.max().item() < 5.0
    # The uncorrected batch is off by much more than its own sampling noise.
    z_raw = (batch_gradient(False) - on_policy).abs() / (standard_error(bandit["raw"]) + 1e-9)
    assert z_raw.max().item() > 10.0


# --------------------------------------------------------------------------- 2. decoupled PPO


def areal_decoupled_ppo_loss(
    logprobs: torch.Tensor,
    *,
    proximal: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps: float,
    cap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-J(theta) of AReaL's eq. 5 averaged over the batch's tokens; (loss, clip-active mask).

    `cap` truncates the behaviour weight at `cap` (rlvr's tis_cap; AReaL's code instead drops
    the tokens above its cap)."""
    weight = (proximal - behaviour).exp()
    if cap is not None:
        weight = weight.clamp(max=cap)
    u = (logprobs - proximal).exp()
    surrogate = torch.minimum(u * advantages, u.clamp(1 - eps, 1 + eps) * advantages)
    per_token = -weight * surrogate * mask
    clipped = (u.clamp(1 - eps, 1 + eps) * advantages < u * advantages) & mask.bool()
    return per_token.sum() / mask.sum(), clipped


@pytest.fixture(scope="module")
def stale_batch():
    """Multi-token responses sampled autoregressively by weights v-1 (EOS ends one, the rest is
    padding), with their behaviour log-probs, and per-sequence advantages."""
    torch.manual_seed(2)
    behaviour = tiny_policy(seed=3)
    current = moved(behaviour, scale=0.08, seed=4)
    n, horizon = 64, 6
    prompts = torch.randint(2, V, (n, 3))
    ids = prompts.clone()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _ in range(horizon):
            probs = torch.softmax(behaviour(ids).logits[:, -1].float(), dim=-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)], dim=1)
        responses = ids[:, prompts.shape[1] :]
        ended = (responses == EOS).long().cumsum(1)
        mask = ((ended - (responses == EOS).long()) == 0).float()  # up to and including the first EOS
        b_logp = response_logprobs(behaviour, prompts, responses)
    advantages = torch.randn(n, 1).expand(n, horizon).contiguous()
    return dict(current=current, prompts=prompts, responses=responses, mask=mask, b_logp=b_logp, adv=advantages)


def test_one_update_equals_areal_with_the_proximal_policy_at_the_current_weights(stale_batch) -> None:
    s, model = stale_batch, stale_batch["current"]
    assert s["mask"].sum() > 2 * s["mask"].shape[0]  # multi-token responses, some cut by EOS
    logp = response_logprobs(model, s["prompts"], s["responses"])
    ours, metrics = rlvr_loss(logp, behaviour=s["b_logp"], advantages=s["adv"], mask=s["mask"])
    ref, clipped = areal_decoupled_ppo_loss(
        logp, proximal=logp.detach(), behaviour=s["b_logp"], advantages=s["adv"], mask=s["mask"], eps=0.2
    )
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(flat_grad(ours, model), flat_grad(ref, model))
    # u = 1 on every token: decoupled PPO's clip cannot bind on the first update, whatever the staleness.
    assert metrics["clip_frac"] == 0.0 and not clipped.any()
    # ... while the behaviour weight is far from 1 on some tokens: the correction is all in it.
    weights = (logp.detach() - s["b_logp"]).exp()[s["mask"].bool()]
    assert (weights - 1).abs().max() > 0.2


@pytest.mark.parametrize("cap", [None, 1.1])
def test_after_the_weights_moved_past_the_proximal_policy_equals_areal(stale_batch, cap: float | None) -> None:
    """Later mini-batches (pi_old recomputed at the start of the step = prox, theta moved since):
    the clip binds on some tokens, and rlvr's loss, gradient and clip_frac are AReaL's; with a
    cap that binds, rlvr truncates the behaviour weight at tis_cap."""
    s = stale_batch
    prox_model = s["current"]
    theta = moved(prox_model, scale=0.05, seed=6)
    with torch.no_grad():
        proximal = response_logprobs(prox_model, s["prompts"], s["responses"])
    logp = response_logprobs(theta, s["prompts"], s["responses"])
    ours, metrics = rlvr_loss(
        logp,
        behaviour=s["b_logp"],
        advantages=s["adv"],
        mask=s["mask"],
        proximal=proximal,
        tis_cap=1e6 if cap is None else cap,
    )
    ref, clipped = areal_decoupled_ppo_loss(
        logp, proximal=proximal, behaviour=s["b_logp"], advantages=s["adv"], mask=s["mask"], eps=0.2, cap=cap
    )
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(flat_grad(ours, theta), flat_grad(ref, theta))
    frac = clipped.sum().item() / s["mask"].sum().item()
    assert frac > 0.01 and metrics["clip_frac"] == pytest.approx(frac)
    if cap is not None:
        assert metrics["tis_clip_frac"] > 0.01


def test_mismatch_kl_is_kl_of_the_sampler_to_pi_old(bandit) -> None:
    """mismatch_kl estimates KL(pi_rollout || pi_old) from tokens the rollout sampled: over many
    samples it converges to the exact KL (its mirrored form, 1/r - 1 + log r, converges to
    chi^2 - KL instead and blows up on a token the update made unlikely)."""
    n = 20000
    prompts, current = bandit["prompts"], bandit["current"]
    g = torch.Generator().manual_seed(11)
    samples = torch.multinomial(bandit["b_probs"], n, replacement=True, generator=g)
    rows = torch.arange(prompts.shape[0]).repeat_interleave(n)
    tokens = samples.reshape(-1)
    with torch.no_grad():
        v_logp = next_logprobs(current, prompts)
    logp = v_logp[rows, tokens].unsqueeze(-1)
    adv = torch.zeros_like(logp)
    _, metrics = rlvr_loss(
        logp, behaviour=bandit["b_logp"][rows, tokens].unsqueeze(-1), advantages=adv, mask=torch.ones_like(adv)
    )
    exact = bandit["kl"]  # mean over prompts of KL(pi_{v-1} || pi_v)
    assert metrics["mismatch_kl"] == pytest.approx(exact, rel=0.05)
