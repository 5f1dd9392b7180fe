"""`rlvr launch` on this machine: rollout servers and torchrun trainer ranks as child processes.

The launcher starts each rollout server (`rlvr serve`, vLLM or SGLang), the judge and the trainer
(torchrun) at once, registers each server in the run directory once its /health answers (the
trainer waits for that), shows the dashboard, and supervises (`rlvr/launch/supervisor.py`): a hung
server is killed; with `sync.on_engine_failure = "continue"` a dead rollout server is restarted on
its port and serves again after a full push; a dead judge is restarted; a trainer that dies (not a
stop it declared) is restarted from the newest checkpoint (`experiment.trainer_restarts`) once every
process of it is gone, its workers included (`end_trainer`), as a new generation (`RunDir.next_generation`:
the run directory and the servers refuse the writes and pushes of an older one); a trainer rank whose
heartbeat goes silent for `rollout.health_deadline_s` (stopped whole, or its node frozen) is hung:
its trainer is killed and restarted the same way.
Otherwise a dead child, Ctrl-C or SIGTERM asks the trainer to finish its step and checkpoint before
everything is torn down, with one line saying who died and why. Each
child runs in its own process group, so nothing is left behind, and gets its GPUs from the plan as
CUDA_VISIBLE_DEVICES (docs/running.md, "When something fails"; docs/cluster.md, "One machine").
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rlvr.launch.argv import prepare_servers, trainer_command
from rlvr.launch.failure import LaunchError, checkpoint_note, failure
from rlvr.launch.health import HeartbeatWatch
from rlvr.launch.restarts import Restarts
from rlvr.launch.supervisor import (
    ServerLaunch,
    ServerSupervisor,
    judge_launch,
    register,
    rollout_launch,
    visible_devices,
)
from rlvr.launch.trainer_supervisor import TrainerSupervisor
from rlvr.monitor.metrics import append_event, mark_stopped
from rlvr.monitor.progress import PlainProgress
from rlvr.process import Child, Children, free_port
from rlvr.recipe.plan import PLAN_GPUS_ENV, LaunchPlan, ServerSpec, make_plan
from rlvr.recipe.schema import Recipe
from rlvr.rendezvous import clear_servers
from rlvr.rundir import RunDir

DRAIN_TIMEOUT_S = 300.0  # a trainer told to stop after a child died: its step and checkpoint

__all__ = ["LaunchError", "LocalLauncher", "run_local", "served_judge"]


@contextlib.contextmanager
def served_judge(recipe: Recipe, *, log: Path, timeout_s: float = 300.0) -> Iterator[str]:
    """The judge as `rlvr launch` serves it, for the length of a `with` (`rlvr eval` of a judged
    domain); yields its URL, raises LaunchError if it does not come up, stops it on every exit."""
    judge = ServerSupervisor(Children(death_signal=signal.SIGTERM), log=lambda _: log)
    try:
        launch = judge_launch(recipe, port=free_port())  # a free port: two runs must not collide
        judge.start(launch)
        judge.wait_healthy(timeout_s=timeout_s)
        yield launch.url
    finally:
        judge.stop(grace_s=10)


class LocalLauncher:
    def __init__(
        self,
        recipe: Recipe,
        *,
        run_dir: Path,
        resume: str = "auto",
        env: dict[str, str] | None = None,
        prompt_tokens: int | None = None,
    ):
        """`prompt_tokens`: the longest prompt launch measured in the data (None: not measured),
        which sizes the embedded servers' KV cache (`server_command`)."""
        self.recipe = recipe
        self.prompt_tokens = prompt_tokens
        self.run_dir = run_dir
        self.resume = resume
        self.plan: LaunchPlan = make_plan(recipe, master_port=free_port())
        # SIGTERM (not SIGKILL) when the launcher dies: torchrun then stops its workers
        env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        env[PLAN_GPUS_ENV] = str(self.plan.gpus_per_node)  # children see only their GPUs: same plan
        self.children = Children(env={**os.environ, **env}, death_signal=signal.SIGTERM)
        self.paths = RunDir(run_dir)
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        self.trainer = TrainerSupervisor(
            self.children,
            self.paths,
            command=lambda resume: trainer_command(self.plan, run_dir=self.run_dir, resume=resume),
            heartbeats=HeartbeatWatch(self.paths.heartbeats, deadline_s=recipe.rollout.health_deadline_s),
            restarts=Restarts(max_restarts=recipe.experiment.trainer_restarts),
            say=self._say,
            env=visible_devices(self.plan.trainer_gpus),
        )
        servers = Children(env=self.children.env, death_signal=signal.SIGTERM)
        self.servers = ServerSupervisor.for_recipe(recipe, servers, log=self.paths.log, run_dir=run_dir)

    def start(self, *, server_timeout_s: float = 300.0) -> None:
        """Start every child at once, then register each server as it turns healthy.

        The trainer does not wait for the servers to start: it imports torch and builds its model
        while they load theirs, then waits for their registration files (`rlvr.rendezvous`).
        Started one after another, the three start-ups were most of a short run's wall clock.
        """
        clear_servers(self.run_dir)
        prepare_servers(self.recipe)
        if self.recipe.judge is not None:
            self.servers.start(judge_launch(self.recipe, port=free_port()))
        for spec in self.plan.servers:
            self.servers.start(self._server(spec))
        self.trainer.start(resume=self.resume)
        self.servers.wait_healthy(timeout_s=server_timeout_s, on_healthy=functools.partial(register, self.run_dir))

    def _server(self, spec: ServerSpec) -> ServerLaunch:
        """Local servers take free ports: two runs on one machine must not collide. A restart
        reuses the port: its URL is the one registered."""
        spec = ServerSpec(index=spec.index, node=spec.node, port=free_port(), gpus=spec.gpus, engine=spec.engine)
        return rollout_launch(self.recipe, spec, colocate=self.plan.colocate, prompt_tokens=self.prompt_tokens)

    def check(self) -> int | None:
        """None while running; the trainer's exit code when done; raises when the run must stop
        (see the module docstring: what dies is restarted where it can be)."""
        self.servers.kill_hung()
        for fresh in self.servers.restart_due():
            self._say(f"{fresh.name} restarted (pid {fresh.pid})", level="warning")
        for child in self.servers.dead():
            self._server_died(child)
        done = self.trainer.poll()
        if done is None or done.error is None:
            return None if done is None else done.code
        raise done.error

    def _server_died(self, child: Child) -> None:
        """Restart a dead server, or go on without it, or stop the run ("fail" mode, the judge out
        of restarts, or no rollout server left)."""
        why = self.servers.why(child)
        plan = self.servers.died(child)
        if plan is not None:
            self._say(f"{failure(child, why)}; {plan}")
            return
        if (
            self.servers.rollout(child.name)
            and self.recipe.sync.on_engine_failure == "continue"
            and (up := self.servers.up())
        ):
            self._say(f"{failure(child, why)}; the run goes on with {up} rollout server(s)")
            return
        raise self._drained(failure(child, why))

    def _drained(self, error: LaunchError) -> LaunchError:
        """Before the run stops for `error`: the trainer finishes its step (or fails on the dead
        server, which it does with a checkpoint too) and saves; the line says what was kept."""
        if self.trainer.running():
            self.stop_trainer(timeout_s=DRAIN_TIMEOUT_S)
        return LaunchError(f"{error}{checkpoint_note(self.run_dir)}")

    def _say(self, message: str, *, level: str = "error") -> None:
        print(message, file=sys.stderr, flush=True)
        append_event(self.run_dir, message, level=level)

    def wait(self, *, poll_s: float = 0.5) -> int:
        while True:
            code = self.check()
            if code is not None:
                return code
            time.sleep(poll_s)

    def stop_trainer(self, *, timeout_s: float) -> None:
        """Ask the trainer's ranks to finish their step and checkpoint (SIGUSR1 to torchrun's
        workers, not SIGTERM to torchrun: its 30 s kill clock would cut a long step or save
        short), and wait; a second Ctrl-C (or SIGTERM) gives up on it."""
        child = self.trainer.child
        self.trainer.ask_stop(signal.SIGUSR1)
        if child is None or not child.running():
            return
        with contextlib.suppress(subprocess.TimeoutExpired, KeyboardInterrupt):
            child.proc.wait(timeout=timeout_s)

    def shutdown(self, *, grace_s: float = 30.0) -> None:
        """Trainer first (it may be saving), then every server at once (each takes a second or
        two to drain); SIGKILL whatever outlives its grace."""
        if self.trainer.child is not None:
            self.children.stop(self.trainer.child, grace_s=grace_s)
        self.servers.stop(grace_s=5)
        self.children.kill_all(grace_s=5)


def run_local(
    recipe: Recipe,
    *,
    run_dir: Path,
    resume: str = "auto",
    dashboard: bool = True,
    stop_timeout_s: float = 900.0,
    prompt_tokens: int | None = None,
) -> int:
    """Start, watch, and always tear down; returns the trainer's exit code (130 after Ctrl-C).

    `stop_timeout_s` bounds the wait for a stopping trainer: a step plus its checkpoint, never
    a hung rank forever.
    """
    launcher = LocalLauncher(recipe, run_dir=run_dir, resume=resume, prompt_tokens=prompt_tokens)
    live = dashboard and sys.stdout.isatty()  # else (a log file, a pipe, --no-dashboard): a plain line per step
    plain = None if live else PlainProgress(run_dir, emit=lambda line: print(line, flush=True))
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Ctrl-C must checkpoint and tear down even when the launcher inherited SIGINT as ignored
    # (a background job of a non-interactive shell does, and Python then leaves it ignored).
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        launcher.start()
        if plain is None:
            from rlvr.monitor.dashboard import watch

            watch(run_dir, stop=lambda: launcher.check() is not None)
        else:
            plain.follow(stop=lambda: launcher.check() is not None)
        return launcher.wait()
    except KeyboardInterrupt:
        print("stopping: the trainer finishes its step and saves a checkpoint (Ctrl-C again to stop now)",
              file=sys.stderr, flush=True)  # fmt: skip
        launcher.stop_trainer(timeout_s=stop_timeout_s)
        mark_stopped(run_dir)  # the trainer's own word if it got to write one
        if plain is not None:
            plain.poll()  # the steps finished while stopping
        return 130
    finally:
        launcher.shutdown()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
