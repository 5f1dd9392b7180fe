"""Bounded restarts of dead rollout servers: the budget `ServerSupervisor` (supervisor.py) keeps.

A server that dies (an OOM kill, a driver fault, a node hiccup) is restarted on its own port,
so its registered URL stays valid; the weight sync holds it until a full push has given it the
current weights (`rlvr/sync/engine_calls.py`), then it serves again. Restarts are bounded and spaced
(2, 4, 8 s by default): a server that dies at start-up every time must not spin forever.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

MAX_RESTARTS = 3
BACKOFF_S = 2.0


@dataclass
class Restarts:
    max_restarts: int = MAX_RESTARTS
    backoff_s: float = BACKOFF_S
    attempts: dict[str, int] = field(default_factory=dict)
    _due: dict[str, float] = field(default_factory=dict)

    def died(self, name: str) -> str | None:
        """Schedule a restart of `name`; what to tell the user, or None when it is out of restarts."""
        attempt = self.attempts.get(name, 0) + 1
        if attempt > self.max_restarts:
            return None
        self.attempts[name] = attempt
        delay = self.backoff_s * 2 ** (attempt - 1)
        self._due[name] = time.monotonic() + delay
        return (
            f"restarting it in {delay:g} s (attempt {attempt} of {self.max_restarts}); it serves again after the "
            "next full weight push"
        )

    def due(self) -> list[str]:
        """The servers whose restart time has come (each returned once)."""
        now = time.monotonic()
        ready = [name for name, when in self._due.items() if when <= now]
        for name in ready:
            del self._due[name]
        return ready
