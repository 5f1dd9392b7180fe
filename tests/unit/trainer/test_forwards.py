"""Forwards per step: pi_old costs a forward only when the training forward cannot give it.

Counted on the tiny model for each algorithm shape, on- and off-policy (samples from weights
older than the trainer's): one update per batch takes pi_old from the training forward's own
detached log-probs (decoupled PPO's proximal policy is the current weights); several updates
per batch, or a KL-shaped reward (which needs pi_old before the advantages), recompute it once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from rlvr.trainer import actor as actor_module
from rlvr.trainer.actor import Actor
from rlvr.trainer.step import train_on
from rlvr.types import RolloutBatch


def rollout(*, stale: bool) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    batch = RolloutBatch()
    for i in range(4):
        response = torch.randint(4, 90, (6,), generator=g).tolist()
        batch.prompts.append(torch.randint(4, 90, (5,), generator=g).tolist())
        batch.responses.append(response)
        batch.rollout_logprobs.append([-1.0] * len(response))
        batch.rewards.append(float(i % 2))
        batch.loss_masks.append(1.0)
        batch.group_ids.append(i // 2)
        batch.domains.append("math")
        batch.versions.append(2 if stale and i == 0 else 3)  # trainer at version 3
    return batch


SHAPES = {
    "one update": ({}, 0),
    "epochs x mini-batches": ({"ppo_epochs": 2, "mini_batches": 2}, 1),
    "KL in the reward": ({"kl_in": "reward", "kl_coef": 0.1}, 1),
    "KL in the loss": ({"kl_in": "loss", "kl_coef": 0.1}, 0),
}


@pytest.mark.parametrize("stale", [False, True], ids=["on-policy", "off-policy"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_no_grad_policy_forwards_per_step(tiny_model_dir: Path, monkeypatch, shape: str, stale: bool) -> None:
    knobs, expected = SHAPES[shape]
    algorithm = AlgorithmConfig(preset="grpo", **knobs)
    actor = Actor.build(
        ModelConfig(path=str(tiny_model_dir)), TrainerConfig(strategy="none", lr=1e-3), algorithm,
        total_steps=10, device=torch.device("cpu"),
    )  # fmt: skip
    policy_forwards = {"no_grad": 0, "ref": 0, "train": 0}
    real = actor_module.token_logprobs

    def counted(model, mb, **kw):
        if model is actor.trainer.model:
            policy_forwards["no_grad" if not torch.is_grad_enabled() else "train"] += 1
        else:
            policy_forwards["ref"] += 1
        return real(model, mb, **kw)

    monkeypatch.setattr(actor_module, "token_logprobs", counted)
    metrics = train_on(rollout(stale=stale), actor=actor, critic=None, algorithm=algorithm, kl_coef=0.1, pad_id=0)
    updates = algorithm.ppo_epochs * algorithm.mini_batches
    assert policy_forwards["no_grad"] == expected, policy_forwards
    assert policy_forwards["train"] >= updates
    assert policy_forwards["ref"] == (0 if algorithm.kl_in == "none" else 1)
    if stale and expected == 0:  # the correction still sees the gap to the engine's log-probs
        assert metrics["mismatch_kl"] > 0.0
