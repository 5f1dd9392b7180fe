"""Rollouts -> a `TrainBatch` the losses can use: the one place a step's batch is prepared.

In order: token ids and rewards become tensors; the reference log-probs (KL anywhere), pi_old
(recomputed only when the loss cannot take the training forward's own: several updates per batch,
or KL in the reward), the critic's values, then advantages (KL in the reward shapes the rewards
first). `Actor.prepare` computes the log-probs; this module decides which are needed and when.
Off-policy (asynchronous rollout), pi_old is the trainer's *current* weights (decoupled PPO's
proximal policy) and the loss's truncated importance weight corrects for the weights that sampled;
with one update per batch that is the training forward itself, so no forward is spent on it
(docs/async.md). Collective: every rank calls it with the same rollouts.
"""

from __future__ import annotations

from rlvr.algorithms.advantages import compute_advantages, raft_mask
from rlvr.algorithms.kl import kl_penalty
from rlvr.recipe.schema import AlgorithmConfig
from rlvr.trainer.actor import Actor
from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.critic import Critic
from rlvr.types import RolloutBatch


def prepare_batch(
    rollout: RolloutBatch,
    *,
    actor: Actor,
    critic: Critic | None,
    algorithm: AlgorithmConfig,
    kl_coef: float,
    pad_id: int,
) -> TrainBatch:
    """The step's TrainBatch at the trainer's current weights (see the module docstring)."""
    algo = algorithm
    batch = TrainBatch.from_rollout(rollout, pad_id=pad_id)  # flat arrays -> padded tensors, no per-token loop
    if algo.kl_in != "none":
        batch = batch.replace(ref_logprobs=actor.compute_ref_logprobs(batch))
    single_update = algo.ppo_epochs * algo.mini_batches == 1
    # One update per batch: pi_old is the training forward's own detached log-probs, on- or
    # off-policy (decoupled PPO's proximal policy is the current weights, which that forward
    # runs). Only a KL-shaped reward needs pi_old before the advantages, so a forward of its own.
    batch = actor.prepare(batch, pi_old_from_forward=single_update and algo.kl_in != "reward")
    kl = None
    if algo.kl_in == "reward":
        assert batch.old_logprobs is not None and batch.ref_logprobs is not None
        kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, estimator=algo.kl_estimator)
    values = None
    if critic is not None:
        values = critic.compute_values(batch)
        batch = batch.replace(old_values=values)
    rewards = batch.rewards
    assert rewards is not None
    mask = batch.response_mask
    if algo.advantage == "raft":
        mask = mask * raft_mask(rewards, threshold=algo.raft_threshold).unsqueeze(1).to(mask.dtype)
    advantages, returns = compute_advantages(
        cfg=algo, rewards=rewards, group_ids=batch.group_ids, mask=mask, values=values, kl=kl, kl_coef=kl_coef
    )
    return batch.replace(advantages=advantages, returns=returns, response_mask=mask)
