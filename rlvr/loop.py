"""The RL loop. Every trainer rank runs `RLLoop.run()`; rank 0 also drives rollout and rewards.

One step, as in DESIGN.md:

    batch, m  = controller.collect(step)       # rank 0: prompts -> groups -> rewards -> filters
    batch     = broadcast(batch)               # every rank gets the same token ids and rewards
    train     = prepare(batch)                 # old/ref logprobs, values, advantages (collective)
    m        |= actor.train_step(train)        # FSDP2 update (+ critic)
    sync.push(version=step)                    # new weights to the rollout engines
    recorder.log(step, m); maybe_eval(); maybe_save()

A SIGTERM/SIGUSR1 (Ctrl-C in the launcher, SLURM preemption) is noted and acted on at
the end of the current step: checkpoint, then exit with code 0 after a finished run or
`PREEMPTED_EXIT` after a stop, so a requeued job resumes from exactly there.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.algorithms.advantages import compute_advantages, raft_mask
from rlvr.algorithms.kl import kl_penalty, make_kl_controller
from rlvr.controller import Controller, RolloutBatch
from rlvr.recipe.schema import Recipe
from rlvr.trainer import dist as d
from rlvr.trainer.actor import Actor
from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.checkpoint import find_latest, load_checkpoint, save_checkpoint

PREEMPTED_EXIT = 3


class StopFlag:
    """Set by SIGTERM/SIGUSR1/SIGUSR2 (SLURM time limit, preemption, scancel, Ctrl-C); the loop
    checks it between steps, never mid-collective. The handler only sets a flag: anything more
    (locks, I/O) can deadlock inside a signal handler."""

    def __init__(self) -> None:
        self.raised = False
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
            signal.signal(sig, self._set)

    def _set(self, *_: Any) -> None:
        self.raised = True

    def agreed(self) -> bool:
        """All ranks stop together: any rank's flag stops everyone."""
        return bool(d.all_reduce([1.0 if self.raised else 0.0], op="max")[0]) if d.is_dist() else self.raised


class RLLoop:
    def __init__(
        self,
        recipe: Recipe,
        *,
        run_dir: Path,
        actor: Actor,
        critic: Any = None,
        controller: Controller | None = None,
        sync: Any = None,
        recorder: Any = None,
        pad_id: int = 0,
    ):
        self.recipe = recipe
        self.run_dir = run_dir
        self.actor = actor
        self.critic = critic
        self.controller = controller  # rank 0 only
        self.sync = sync
        self.recorder = recorder  # rank 0 only
        self.pad_id = pad_id
        self.kl = make_kl_controller(recipe.algorithm)
        self.step = 0
        self.stop = StopFlag()

    # -- the step --------------------------------------------------------------------------------
    def run(self) -> int:
        exp = self.recipe.experiment
        while self.step < exp.max_steps:
            start = time.perf_counter()
            metrics = self.train_one_step()
            self.step += 1
            if self.sync is not None:
                t0 = time.perf_counter()
                metrics.update(self.sync.push(version=self.step) or {})
                metrics["time/sync"] = time.perf_counter() - t0
            if self.controller is not None:
                self.controller.policy_version = self.step
            if exp.eval_steps and self.step % exp.eval_steps == 0:
                metrics.update(self.evaluate())
            metrics["time/step"] = time.perf_counter() - start
            self.log(metrics)
            stopping = self.stop.agreed()
            if stopping or (exp.save_steps and self.step % exp.save_steps == 0) or self.step == exp.max_steps:
                self.save()
            if stopping and self.step < exp.max_steps:
                return PREEMPTED_EXIT
        return 0

    def train_one_step(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        rollout = None
        if self.controller is not None:
            rollout, metrics = self.controller.collect(self.step)
        rollout = d.broadcast_object(rollout) if d.is_dist() else rollout
        assert isinstance(rollout, RolloutBatch)
        if len(rollout) == 0:  # every group was filtered out: nothing to learn from this step
            return {**metrics, "train/skipped": 1.0}
        t0 = time.perf_counter()
        batch = self.prepare(rollout)
        train = self.actor.train_step(batch, kl_coef=self.kl.value)
        if self.critic is not None:
            train.update({f"critic/{k}": v for k, v in self.critic.train_step(batch).items()})
        if "kl" in train:
            self.kl.update(train["kl"], n_steps=len(rollout))
        metrics.update(train)
        metrics["kl_coef"] = float(self.kl.value)
        metrics["time/train"] = time.perf_counter() - t0
        tokens = sum(len(r) for r in rollout.responses)
        metrics["throughput/tokens_per_s"] = tokens / max(
            metrics.get("time/rollout", 0.0) + metrics["time/train"], 1e-9
        )
        return metrics

    def prepare(self, rollout: RolloutBatch) -> TrainBatch:
        """Rollout -> TrainBatch with ref logprobs, values and advantages (collective)."""
        algo = self.recipe.algorithm
        batch = TrainBatch.from_sequences(
            rollout.prompts,
            rollout.responses,
            rollout_logprobs=rollout.rollout_logprobs,
            response_masks=rollout.loss_masks,
            group_ids=rollout.group_ids,
            rewards=rollout.rewards,
            pad_id=self.pad_id,
        )
        kl = None
        if algo.kl_in != "none":
            batch = batch.replace(ref_logprobs=self.actor.compute_ref_logprobs(batch))
        if algo.kl_in == "reward":  # the KL penalty shapes the rewards, so pi_old is needed before advantages
            old_logprobs, _ = self.actor.compute_logprobs(batch)
            batch = batch.replace(old_logprobs=old_logprobs)
            assert batch.ref_logprobs is not None
            kl = kl_penalty(old_logprobs, batch.ref_logprobs, estimator=algo.kl_estimator or "k1")
        # Otherwise the actor fills pi_old itself, and skips that forward for a single on-policy update.
        values = None
        if self.critic is not None:
            values = self.critic.compute_values(batch)
            batch = batch.replace(old_values=values)
        rewards = batch.rewards
        assert rewards is not None
        mask = batch.response_mask
        if algo.advantage == "raft":
            mask = mask * raft_mask(rewards, threshold=algo.raft_threshold or 0.0).unsqueeze(1).to(mask.dtype)
        advantages, returns = compute_advantages(
            cfg=algo, rewards=rewards, group_ids=batch.group_ids, mask=mask, values=values, kl=kl, kl_coef=self.kl.value
        )
        return batch.replace(advantages=advantages, returns=returns, response_mask=mask)

    # -- eval, logging, checkpoints ----------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        return self.controller.evaluate(self.step) if self.controller is not None else {}

    def log(self, metrics: dict[str, float]) -> None:
        if self.recorder is not None:
            self.recorder.log(self.step, metrics)

    @property
    def checkpoint_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def parts(self) -> dict[str, Any]:
        return {"actor": self.actor.engine, **({"critic": self.critic.engine} if self.critic is not None else {})}

    def save(self) -> Path:
        extra = {
            "step": self.step,
            "kl": self.kl.state_dict(),
            "controller": self.controller.state_dict() if self.controller is not None else None,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        }
        path = save_checkpoint(
            self.checkpoint_root, self.step, self.parts(), extra=extra, keep_last=self.recipe.experiment.keep_last
        )
        if self.recorder is not None:
            self.recorder.event(f"checkpoint saved: {path.name}", level="info")
        return path

    def resume(self, spec: str) -> bool:
        """`auto`: the latest complete checkpoint if any; `none`: start fresh; else a checkpoint path."""
        if spec == "none":
            return False
        path = find_latest(self.checkpoint_root) if spec == "auto" else Path(spec)
        if path is None:
            return False
        extra = load_checkpoint(path, self.parts())
        self.step = int(extra["step"])
        self.kl.load_state_dict(extra["kl"])
        if self.controller is not None and extra.get("controller") is not None:
            self.controller.load_state_dict(extra["controller"])
        random.setstate(extra["rng"]["python"])
        np.random.set_state(extra["rng"]["numpy"])
        torch.set_rng_state(extra["rng"]["torch"])
        if self.recorder is not None:
            self.recorder.event(f"resumed from {path} at step {self.step}", level="info")
        return True
