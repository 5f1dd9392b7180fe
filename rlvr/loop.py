"""The RL loop. Every trainer rank runs `RLLoop.run()`; rank 0 also owns the rollout manager.

    batch, m  = manager.take(step)             # rank 0: wave `step`, generated and scored ahead
    batch     = broadcast(batch)               # every rank gets the same token ids and rewards
    m        |= train_on(batch)                # log-probs, advantages, FSDP2 updates (rlvr/trainer/step.py)
    manager.pause(); sync.push(version=step+1); manager.resume(version=step+1)
    recorder.log(step, m); maybe_eval(); maybe_save()

The manager generates up to `rollout.max_staleness` steps ahead (0: synchronous). Signals and
failures stop at a step boundary with a checkpoint and one line (a stop while a wave is collected
gives that wave up; docs/running.md, "When something fails"); `experiment.eval_at_start` logs an eval as step 0 on a fresh run.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.algorithms.kl import make_kl_controller
from rlvr.collect.manager import RolloutManager
from rlvr.monitor.metrics import RunRecorder
from rlvr.recipe.schema import Recipe
from rlvr.rollout.base import RolloutError
from rlvr.rundir import RunDir, latest_checkpoint, step_dir
from rlvr.sync.base import SyncError, WeightSync
from rlvr.sync.colocate import colocation_for
from rlvr.trainer import dist as d
from rlvr.trainer.actor import Actor
from rlvr.trainer.checkpoint import load_checkpoint, save_checkpoint
from rlvr.trainer.critic import Critic
from rlvr.trainer.step import train_on
from rlvr.types import RolloutBatch

log = logging.getLogger(__name__)

PREEMPTED_EXIT = 3
REJOIN_PUSH, REJOIN_DONE = "push", "done"  # rank 0's words to the other ranks while a wave is collected
STOPPED_COLLECTING = "stopped while the step's rollouts were collected"  # not a failure: a stop


class _GiveUpWave(Exception):
    """Raised into `RolloutManager.take` by a stop while rank 0 waits for the wave."""


FAILED_EXIT = 4


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
        critic: Critic | None = None,
        manager: RolloutManager | None = None,
        sync: WeightSync | None = None,
        recorder: RunRecorder | None = None,
        pad_id: int = 0,
        generation: int | None = None,
    ):
        self.recipe = recipe
        self.run_dir = run_dir
        self.actor = actor
        self.critic = critic
        self.manager = manager  # rank 0 only
        self.sync = sync
        self.recorder = recorder  # rank 0 only
        self.pad_id = pad_id
        self.generation = generation  # this trainer start's: a newer one's start fences its writes (rundir)
        self.kl = make_kl_controller(recipe.algorithm)
        self.step = 0
        self.saved_step: int | None = None  # the step of the checkpoint this run saved or resumed
        self.stop = StopFlag()
        self.failure: str | None = None  # why the run stopped itself (the same line on every rank)
        # rollout.colocate: the engines sleep while this trainer trains (rlvr/sync/colocate.py)
        self.colocation = colocation_for(recipe, client=manager.client if manager is not None else None)

    # -- the step --------------------------------------------------------------------------------
    def run(self) -> int:
        exp = self.recipe.experiment
        if exp.eval_at_start and self.saved_step is None:  # not resumed: a resumed run logged it already
            self.log(self.evaluate())  # step 0: the base model, before any wave is generated
        if self.manager is not None:
            self.manager.start(version=self.step)  # the engines serve the weights of `self.step`
        while self.step < exp.max_steps:
            start = time.perf_counter()
            metrics = self.train_one_step()
            if self.failure == STOPPED_COLLECTING:  # a stop while the wave was not in: the last step is kept
                self.failure = None
                self.save()
                return PREEMPTED_EXIT
            if self.failure is not None:  # the step's rollouts are not fit to train on: keep what is sound
                return self.stop_failed()
            self.step += 1
            try:
                metrics.update(self.push_weights())
            except SyncError as exc:  # the step trained: keep it, leave the engines paused
                self.failure = str(exc)
                self.log(metrics)
                return self.stop_failed()
            if exp.eval_steps and self.step % exp.eval_steps == 0:
                metrics.update(self.evaluate())
            metrics["time/step"] = time.perf_counter() - start
            metrics["time/trainer_idle_frac"] = metrics.get("time/wait_rollout", 0.0) / max(metrics["time/step"], 1e-9)
            self.log(metrics)
            stopping = self.stop.agreed()
            if stopping or (exp.save_steps and self.step % exp.save_steps == 0) or self.step == exp.max_steps:
                self.save()
            if stopping and self.step < exp.max_steps:
                return PREEMPTED_EXIT
        return 0

    def train_one_step(self) -> dict[str, float]:
        rollout, metrics = self.collect()  # wave `step`, the same batch on every rank
        if rollout is None:  # the step failed (`self.failure` says why)
            return metrics
        if len(rollout) == 0:  # every group was filtered out (or stale): nothing to learn from this step
            return {**metrics, "train/skipped": 1.0}
        t0 = time.perf_counter()
        train = train_on(rollout, actor=self.actor, critic=self.critic, algorithm=self.recipe.algorithm,
                         kl_coef=self.kl.value, pad_id=self.pad_id)  # fmt: skip
        if "kl" in train:
            self.kl.update(train["kl"], n_steps=len(rollout))
        metrics.update(train)
        metrics["kl_coef"] = float(self.kl.value)
        metrics["time/train"] = time.perf_counter() - t0
        tokens = rollout.num_tokens
        metrics["throughput/tokens_per_s"] = tokens / max(
            metrics.get("time/wait_rollout", 0.0) + metrics["time/train"], 1e-9
        )
        return metrics

    def collect(self) -> tuple[RolloutBatch | None, dict[str, float]]:
        """Rank 0 takes wave `step` from the manager (colocated engines then free the GPUs); every
        rank gets the same batch, or the same failure (then None, with `self.failure` set)."""
        metrics: dict[str, float] = {}
        rollout, failure = None, None
        if self.manager is not None:
            try:
                rollout, metrics = self.manager.take(self.step, while_waiting=self.while_collecting)
                failure = self.manager.stop_reason
            except RolloutError as exc:  # every server dead, retries spent: no batch for this step
                failure = f"rollout failed in step {self.step + 1}: {exc}"
            except _GiveUpWave:
                failure = STOPPED_COLLECTING
        if self.rejoins:
            self.rejoin_together(None if self.manager is None else REJOIN_DONE)
        if self.colocation is not None:  # the engines free the shared GPUs for this step
            try:
                self.colocation.release()
            except SyncError as exc:
                failure = failure or str(exc)
        if d.is_dist():
            rollout, failure = d.broadcast_rollout(rollout, failure)  # flat arrays, one buffer
        if failure is not None:
            self.failure = failure
            return None, metrics
        assert isinstance(rollout, RolloutBatch)
        return rollout, metrics

    @property
    def rejoins(self) -> bool:
        """Whether a waiting wave may push to a server that came back ("continue"; see `rejoin_stranded`)."""
        return self.sync is not None and self.recipe.sync.on_engine_failure == "continue"

    def while_collecting(self) -> None:
        """Rank 0, every few seconds while wave `step` is not in: a stop (SIGTERM, preemption) gives
        the wave up, since what it waits for (servers, a judge) may be going down with the job and
        would hold the checkpoint past the grace period; otherwise a server that came back may need
        the current weights (`rejoin_stranded`)."""
        if self.stop.raised:
            raise _GiveUpWave
        self.rejoin_stranded()

    def rejoin_stranded(self) -> None:
        """While rank 0 waits for a wave: if every server was lost and one is back (restarted, so on
        its base weights), push it the weights of `self.step` now; the wave's groups wait for it,
        and no sample mixes two versions. The regular push does this when other servers are live."""
        if not self.rejoins or self.manager is None or not self.manager.stranded():
            return
        log.warning(
            "a rollout server is back after every server was lost: it gets version %d, then the wave goes on", self.step
        )  # fmt: skip (the death itself is the launcher's one line in events.jsonl)
        self.rejoin_together(REJOIN_PUSH)

    def rejoin_together(self, word: str | None) -> None:
        """The push is collective: rank 0 says `push` (then pushes) or `done` (the wave is in); the
        other ranks, waiting here for the wave, join each push until `done`."""
        if not d.is_dist():
            if word == REJOIN_PUSH:
                self.push_weights()
            return
        if self.manager is not None:  # rank 0
            d.broadcast_object(word)
            if word == REJOIN_PUSH:
                self.push_weights()
            return
        while d.broadcast_object(None) == REJOIN_PUSH:
            self.push_weights()

    def push_weights(self) -> dict[str, float]:
        """New weights to the engines as version `self.step`: the manager holds new groups and
        aborted episodes meanwhile, then admits what the staleness bound allows. A push that
        raises leaves the gate closed: the outcome decides, not a `finally`."""
        t0 = time.perf_counter()
        if self.colocation is not None:  # engines awake before the push (a failure raises SyncError)
            self.colocation.resume()
        if self.manager is not None:
            self.manager.pause()
        metrics = dict(self.sync.push(version=self.step) or {}) if self.sync is not None else {}
        if self.manager is not None:
            self.manager.resume(version=self.step)
        metrics["time/sync"] = time.perf_counter() - t0
        return metrics

    def stop_failed(self) -> int:
        """Checkpoint what the trainer holds (the last finished step) and stop with `failure` said."""
        self.log_events()
        if self.recorder is not None and self.failure is not None:
            self.recorder.event(self.failure, level="error")
        self.save()
        return FAILED_EXIT

    # -- eval, logging, checkpoints ----------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        return self.manager.evaluate(self.step) if self.manager is not None else {}

    def log(self, metrics: dict[str, float]) -> None:
        if self.recorder is not None:
            RunDir(self.run_dir).check_generation(self.generation, doing=f"the metrics of step {self.step}")
            self.recorder.log(self.step, metrics)
            if self.manager is not None:
                self.recorder.samples(self.manager.pop_samples())
        self.log_events()

    def log_events(self) -> None:
        if self.recorder is not None and self.manager is not None:
            for message in self.manager.pop_events():
                self.recorder.event(message, level="warning")

    @property
    def checkpoint_root(self) -> Path:
        return RunDir(self.run_dir).checkpoints

    def parts(self) -> dict[str, Any]:
        return {"actor": self.actor.trainer, **({"critic": self.critic.trainer} if self.critic is not None else {})}

    def save(self) -> Path:
        root = self.checkpoint_root
        if self.saved_step == self.step:  # nothing trained since: keep that checkpoint (no rewrite window)
            return step_dir(root, self.step)
        extra = {
            "step": self.step,
            "kl": self.kl.state_dict(),
            "manager": self.manager.state_dict(step=self.step) if self.manager is not None else None,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        }
        path = save_checkpoint(
            root, self.step, self.parts(), extra=extra, keep_last=self.recipe.experiment.keep_last,
            generation=self.generation,
        )  # fmt: skip
        self.saved_step = self.step
        if self.recorder is not None:
            self.recorder.event(f"checkpoint saved: {path.name}", level="info")
        return path

    def resume(self, spec: str) -> bool:
        """`auto`: the latest complete checkpoint if any; `none`: start fresh; else a checkpoint path."""
        path = None if spec == "none" else latest_checkpoint(self.checkpoint_root) if spec == "auto" else Path(spec)
        if path is None:  # a fresh start: what an attempt without a checkpoint logged runs again
            self._rewind(-1 if self.recipe.experiment.eval_at_start else 0)  # its step-0 eval too
            return False
        extra = load_checkpoint(path, self.parts())
        self.step = self.saved_step = int(extra["step"])
        self.kl.load_state_dict(extra["kl"])
        state = extra.get("manager")
        if self.manager is not None and state is not None:
            self.manager.load_state_dict(state)
        random.setstate(extra["rng"]["python"])
        np.random.set_state(extra["rng"]["numpy"])
        torch.set_rng_state(extra["rng"]["torch"])
        if self.recorder is not None:
            self.recorder.set_state("starting", step=self.step)  # a stop before its first new step: not "step 0"
            self.recorder.event(f"resumed from {path} at step {self.step}", level="info")
        self._rewind(self.step)
        return True

    def _rewind(self, step: int) -> None:
        """The steps an earlier attempt logged after `step` run again: log each once."""
        if self.recorder is not None and (dropped := self.recorder.rewind(step)):
            since = f"after step {step}" if step >= 0 else "from step 0 on"
            self.recorder.event(f"{dropped} step(s) logged {since} were lost with the last attempt; they run again")
