"""The trainer's half of an RL step, top to bottom: log-prob passes, advantages, updates, losses.

`train_on(rollout)` is what every trainer rank runs on a step's scored rollouts (rlvr/loop.py
collects them and pushes the new weights after). `logprob_passes` is the one place that decides
which no-grad forwards a step pays for; the policy and value losses are written out here, each
run over `ppo_epochs` x `mini_batches` optimizer steps of packed micro-batches. Collective:
every rank calls it with the same rollouts (docs/trainer.md has how ranks share a mini-batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.algorithms.advantages import compute_advantages, raft_mask
from rlvr.algorithms.kl import kl_penalty
from rlvr.algorithms.losses import compute_policy_loss, compute_value_loss
from rlvr.recipe.schema import AlgorithmConfig
from rlvr.trainer.actor import Actor
from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.critic import Critic
from rlvr.trainer.forward import EntropyMode
from rlvr.trainer.model_trainer import LossFn, ModelTrainer, Tally
from rlvr.trainer.packing import MicroBatch, slice_rows
from rlvr.types import RolloutBatch


def train_on(
    rollout: RolloutBatch,
    *,
    actor: Actor,
    critic: Critic | None,
    algorithm: AlgorithmConfig,
    kl_coef: float,
    pad_id: int,
) -> dict[str, float]:
    """One step's optimisation on `rollout`; metrics of the actor (and `critic/...`)."""
    batch = TrainBatch.from_rollout(rollout, pad_id=pad_id)  # flat arrays -> padded tensors
    batch = with_logprobs(batch, actor=actor, algorithm=algorithm)  # reference, pi_old: what the loss needs
    if critic is not None:
        batch = batch.replace(old_values=critic.compute_values(batch))
    batch = with_advantages(batch, algorithm=algorithm, kl_coef=kl_coef)
    metrics = update_policy(actor, batch, kl_coef=kl_coef)
    if critic is not None:
        metrics.update({f"critic/{k}": v for k, v in update_critic(critic, batch).items()})
    return metrics


@dataclass(frozen=True, slots=True)
class LogprobPasses:
    reference: bool  # the frozen reference's log-probs (KL in the reward or the loss)
    pi_old: bool  # a forward of its own for pi_old; else the training forward's own, detached


def logprob_passes(algorithm: AlgorithmConfig) -> LogprobPasses:
    """With one update per batch the weights have not moved when the training forward runs, so its
    detached log-probs are pi_old (on- or off-policy: decoupled PPO's proximal policy is the current
    weights). Only a KL-shaped reward needs pi_old before the advantages (docs/async.md)."""
    single_update = algorithm.ppo_epochs * algorithm.mini_batches == 1
    return LogprobPasses(
        reference=algorithm.kl_in != "none", pi_old=not (single_update and algorithm.kl_in != "reward")
    )


def with_logprobs(batch: TrainBatch, *, actor: Actor, algorithm: AlgorithmConfig) -> TrainBatch:
    """`batch` with the no-grad log-probs `logprob_passes` asks for that it does not carry yet."""
    passes = logprob_passes(algorithm)
    if passes.reference and batch.ref_logprobs is None:
        batch = batch.replace(ref_logprobs=actor.compute_logprobs(batch, reference=True)[0])
    if passes.pi_old and batch.old_logprobs is None:
        batch = batch.replace(old_logprobs=actor.compute_logprobs(batch)[0])
    return batch


def with_advantages(batch: TrainBatch, *, algorithm: AlgorithmConfig, kl_coef: float) -> TrainBatch:
    """Advantages and returns (KL in the reward shapes the rewards first; RAFT masks the losers)."""
    rewards, mask = batch.rewards, batch.response_mask
    assert rewards is not None
    kl = None
    if algorithm.kl_in == "reward":
        assert batch.old_logprobs is not None and batch.ref_logprobs is not None
        kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, estimator=algorithm.kl_estimator)
    if algorithm.advantage == "raft":
        mask = mask * raft_mask(rewards, threshold=algorithm.raft_threshold).unsqueeze(1).to(mask.dtype)
    advantages, returns = compute_advantages(
        cfg=algorithm, rewards=rewards, group_ids=batch.group_ids, mask=mask, values=batch.old_values, kl=kl,
        kl_coef=kl_coef,
    )  # fmt: skip
    return batch.replace(advantages=advantages, returns=returns, response_mask=mask)


def update_policy(actor: Actor, batch: TrainBatch, *, kl_coef: float | None = None) -> dict[str, float]:
    """The policy's optimizer steps on `batch`; `kl_coef` overrides `algorithm.kl_coef` (the
    adaptive controller's value). Metrics averaged over updates and ranks."""
    algo = actor.algorithm
    batch = with_logprobs(batch, actor=actor, algorithm=algo)
    pi_old_from_forward = batch.old_logprobs is None
    entropy: EntropyMode = "grad" if algo.entropy_coef != 0.0 else "detached"
    max_len = actor.max_response_len or batch.max_response_len

    def loss_fn(mb: MicroBatch, local: TrainBatch, counts: tuple[float, float]) -> tuple[torch.Tensor, dict[str, float], float]:  # fmt: skip
        logp, ent = actor.token_logprobs(mb, entropy=entropy)  # the training forward

        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return slice_rows(t, mb).to(logp.device) if t is not None else None

        mask, advantages, old = rows(local.response_mask), rows(local.advantages), rows(local.old_logprobs)
        assert mask is not None and advantages is not None
        loss, metrics = compute_policy_loss(
            cfg=algo, logprobs=logp, old_logprobs=logp.detach() if pi_old_from_forward else old,  # pyright: ignore[reportArgumentType]
            advantages=advantages, mask=mask, ref_logprobs=rows(local.ref_logprobs),
            rollout_logprobs=rows(local.rollout_logprobs), entropy=ent, kl_coef=kl_coef,
            num_tokens=counts[0], num_seqs=counts[1], max_len=max_len,
        )  # fmt: skip
        metrics.pop("loss", None)  # micro-batch-local; the engine reports the global one
        return loss, metrics, float(mask.sum())

    return optimize(actor.trainer, batch, loss_fn, algorithm=algo)


def update_critic(critic: Critic, batch: TrainBatch) -> dict[str, float]:
    """Clipped value regression on `batch.returns` (old values computed if missing)."""
    if batch.returns is None:
        raise ValueError("update_critic needs batch.returns (from compute_advantages)")
    if batch.old_values is None:
        batch = batch.replace(old_values=critic.compute_values(batch))
    algo = critic.algorithm
    max_len = critic.max_response_len or batch.max_response_len

    def loss_fn(mb: MicroBatch, local: TrainBatch, counts: tuple[float, float]) -> tuple[torch.Tensor, dict[str, float], float]:  # fmt: skip
        values = critic.token_values(mb)
        assert local.old_values is not None and local.returns is not None
        mask = slice_rows(local.response_mask, mb).to(values.device)
        loss, metrics = compute_value_loss(
            values=values, old_values=slice_rows(local.old_values, mb).to(values.device),
            returns=slice_rows(local.returns, mb).to(values.device), mask=mask, value_clip=float(algo.value_clip),
            mode=str(algo.loss_agg), num_tokens=counts[0], num_seqs=counts[1], max_len=max_len,
        )  # fmt: skip
        return loss, metrics, float(mask.sum())

    return optimize(critic.trainer, batch, loss_fn, algorithm=algo)


def optimize(
    engine: ModelTrainer, batch: TrainBatch, loss_fn: LossFn, *, algorithm: AlgorithmConfig
) -> dict[str, float]:
    """`ppo_epochs` passes over the batch, each split into `mini_batches` optimizer steps."""
    tally = Tally()
    for _ in range(algorithm.ppo_epochs):
        for mini in batch.split(algorithm.mini_batches):
            engine.update(mini, loss_fn, tally)  # this rank's micro-batches: loss, backward; clip; step
    return engine.summarize(tally)
