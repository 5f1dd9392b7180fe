"""The trainer's supervisor, one for the local launcher and the SLURM node: start, hang, death, restart.

Every start of the trainer (torchrun's agent and its workers) is the run's next generation
(`RunDir.next_generation`, handed to the ranks as RLVR_TRAINER_GENERATION): the run directory and
the engines refuse the checkpoints, metrics and pushes of an older one. A rank whose heartbeat goes
silent for its deadline (stopped whole, a frozen node) makes the trainer hung, and so does torchrun's
agent stopped for as long (its workers train on, but nobody would reap them or see one die): its
whole tree is killed and it is then a dead trainer like any other. A dead trainer that crashed
(`trainer_crashed`; not one that stated its own error, not one asked to stop) is restarted from the
newest checkpoint within its budget (`Restarts`), and only once every process of it is gone
(`end_trainer`): an orphaned worker must not train through the backoff or beside the next one.
What a final exit means for the run (raise, write the node's exit marker) is the launcher's call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rlvr.launch.failure import LaunchError, failure, stated_error, trainer_crashed
from rlvr.launch.health import HeartbeatWatch
from rlvr.launch.restarts import Restarts, end_trainer
from rlvr.monitor.metrics import logged_steps
from rlvr.process import Child, Children, is_stopped
from rlvr.recipe.plan import TRAINER_RESTART_ENV
from rlvr.rundir import GENERATION_ENV, RunDir, latest_checkpoint

TRAINER = "trainer"


@dataclass(frozen=True)
class TrainerExit:
    """How the trainer ended for good: its exit code and, unless 0, the one line that says why."""

    code: int
    error: LaunchError | None = None


@dataclass
class TrainerSupervisor:
    """The trainer of one launcher, across its restarts. `command(resume)`: its argv; `env`: added to
    every start; `say`: how a restart is announced (stderr and the run's events); `next_generation`:
    the generation of the next start (default the run directory's counter)."""

    children: Children
    paths: RunDir
    command: Callable[[str], list[str]]
    heartbeats: HeartbeatWatch
    restarts: Restarts
    say: Callable[[str], None]
    env: Mapping[str, str] = field(default_factory=dict)
    log_name: str = TRAINER
    next_generation: Callable[[], int] | None = None
    child: Child | None = None  # the current process; None while a restart waits for its time
    generation: int = 0
    hung: str | None = None  # why the current trainer was killed, when it was hung
    stopping: bool = False  # asked to stop (Ctrl-C, preemption): a death then is final
    _previous: Child | None = None  # the last trainer that died, until the next one starts
    _last_code: int = 0
    _steps: int = 0  # steps logged when the current trainer started
    _starts: int = 0
    _stopped_since: float | None = None  # when the agent was first seen stopped (SIGSTOP)

    def start(self, *, resume: str = "auto") -> Child:
        """Start the trainer as the run's next generation, never beside a process of the last one."""
        if self._previous is not None:
            end_trainer(self.children, self._previous)
            self._previous = None
        self.generation = self.next_generation() if self.next_generation else self.paths.next_generation()
        env = {**self.env, TRAINER_RESTART_ENV: str(self._starts), GENERATION_ENV: str(self.generation)}
        self._starts += 1
        self._steps = logged_steps(self.paths.root)
        self.heartbeats.restart()
        self.hung, self._stopped_since = None, None
        self.child = self.children.start(TRAINER, self.command(resume), env=env, log=self.paths.log(self.log_name))
        return self.child

    def poll(self) -> TrainerExit | None:
        """None while the trainer runs or a restart of it is pending; its exit once it is done for good."""
        if self.restarts.due() and not self.stopping:
            self.start()
        child = self.child
        if child is None:  # not started yet, or a restart waits for its time
            if self.stopping and self._previous is not None:
                return TrainerExit(self._last_code, failure(self._previous, "stopped before its restart"))
            return None
        if child.running() and (why := self._hang(child)):
            self.hung = why
            end_trainer(self.children, child)  # SIGKILL, then it is a dead trainer like any other
        code = child.proc.poll()
        if code is None:
            return None
        if code == 0:
            return TrainerExit(0)
        if stated := stated_error(self.paths.root):
            return TrainerExit(code, LaunchError(stated))
        why = failure(child, self.hung or f"died with code {code}")
        if not self.stopping and self._restart(child, why):
            return None
        return TrainerExit(code, failure(child, self.hung or f"exited with code {code}"))

    def _hang(self, child: Child) -> str | None:
        """Why running `child` counts as hung: a rank's heartbeat silent, or the agent stopped, past
        the deadline; None while it is only slow."""
        deadline = self.heartbeats.deadline_s
        if silent := self.heartbeats.hung():
            return f"rank {silent[0]} stopped its heartbeat for {deadline:g} s (hung)"
        if not is_stopped(child.pid):
            self._stopped_since = None
            return None
        now = time.monotonic()
        self._stopped_since = self._stopped_since or now
        if now - self._stopped_since > deadline:
            return f"agent (torchrun) stopped for {deadline:g} s (hung)"
        return None

    def _restart(self, child: Child, why: LaunchError) -> bool:
        """Schedule a restart of crashed `child` within the budget; True when one is scheduled."""
        progressed = logged_steps(self.paths.root) > self._steps
        if not trainer_crashed(int(child.proc.returncode), child.log_path, progressed=progressed):
            return False
        saved = latest_checkpoint(self.paths.checkpoints)
        start = f"checkpoint {saved.name}" if saved else "the start (no checkpoint yet)"
        plan = self.restarts.died(TRAINER, then=f"it resumes from {start}")
        if plan is None:
            return False
        end_trainer(self.children, child)  # now: an orphaned worker must not train through the backoff
        self.child, self._previous, self._last_code = None, child, int(child.proc.returncode)
        self.say(f"{why}; {plan}")
        return True

    def ask_stop(self, sig: int) -> None:
        """Ask the ranks to finish their step and checkpoint (`sig` to the workers, not to torchrun:
        its kill clock would cut a save short); a death from now on is final, a pending restart dropped."""
        self.stopping = True
        if self.child is not None and self.child.running():
            self.child.signal_workers(sig)

    def running(self) -> bool:
        return self.child is not None and self.child.running()
