"""Bounded restarts of a dead child (a rollout server, the judge, the trainer): one budget each.

A server that dies (an OOM kill, a driver fault, a node hiccup) is restarted on its own port, so
its URL stays valid; it is registered again with a new instance first, and the weight sync holds
it until a full push has given it the current weights (`rlvr/sync/engine_calls.py`). A trainer is
restarted from the newest checkpoint, and only once every process of the dead one is gone
(`end_trainer`). Restarts are spaced (2, 4, 8 s by default) and bounded in a
row: a child that dies at start-up every time must not spin forever, while one that then ran for
`stable_s` earns its budget back (a long run survives a fault a day).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rlvr.launch.failure import LaunchError
from rlvr.process import Child, Children

MAX_RESTARTS = 3
BACKOFF_S = 2.0
STABLE_S = 60.0


@dataclass
class Restarts:
    max_restarts: int = MAX_RESTARTS
    backoff_s: float = BACKOFF_S
    stable_s: float = STABLE_S
    attempts: dict[str, int] = field(default_factory=dict)
    _due: dict[str, float] = field(default_factory=dict)
    _last: dict[str, float] = field(default_factory=dict)  # name -> when its last restart was due

    def died(self, name: str, *, then: str = "it serves again after the next full weight push") -> str | None:
        """Schedule a restart of `name`; what to tell the user (ending with `then`), or None when it
        is out of restarts."""
        now = time.monotonic()
        if now - self._last.get(name, -float("inf")) > self.stable_s:
            self.attempts[name] = 0  # it ran long enough since its last restart: a fresh budget
        attempt = self.attempts.get(name, 0) + 1
        if attempt > self.max_restarts:
            return None
        self.attempts[name] = attempt
        delay = self.backoff_s * 2 ** (attempt - 1)
        self._due[name] = self._last[name] = now + delay
        return f"restarting it in {delay:g} s (attempt {attempt} of {self.max_restarts}); {then}"

    def due(self) -> list[str]:
        """The children whose restart time has come (each returned once)."""
        now = time.monotonic()
        ready = [name for name, when in self._due.items() if when <= now]
        for name in ready:
            del self._due[name]
        return ready


def end_trainer(children: Children, trainer: Child) -> None:
    """Before a trainer starts again: every process of the last one is gone, however it died.

    A trainer dies with its torchrun agent's exit, but the workers live in sessions of their own:
    a worker whose agent was SIGKILLed (the OOM killer, a stray kill) would train on beside the
    next trainer, save checkpoints and push weights. Workers also die with their agent
    (`rlvr.worker`, a parent-death signal); this is the launcher's own guarantee: SIGKILL the
    whole tree (`Children.stop`, found by its mark) and wait until it is gone, or refuse to
    start a second trainer beside a process that cannot die."""
    left = children.stop(trainer, grace_s=0)
    if left:
        pids = ", ".join(str(pid) for pid in left)
        raise LaunchError(
            f"{trainer.name}: process(es) {pids} of the last trainer outlived SIGKILL; not starting another beside them"
        )
