"""A hung child told from a slow one: /health (servers) or a heartbeat file (trainer ranks), with a deadline.

A server stopped by SIGSTOP, or deadlocked, keeps its process and its port: nothing dies, and
every request to it waits out its whole timeout. A busy server still answers /health (its HTTP
loop is not its model's), so a server that has answered once since its start and then stays
silent for `deadline_s` is hung: the launcher kills it, and it is restarted like any dead one.
A trainer rank has no HTTP loop: it rewrites its heartbeat file from a thread of its own
(`rlvr.process.Heartbeat`), so a rank stopped whole (SIGSTOP, a frozen node) goes silent while a
slow step does not; `HeartbeatWatch` finds the silent one, and the launcher kills the trainer's
tree and restarts it as it would a dead one. (A collective deadlocked with every rank alive keeps
beating: torch's collective timeout ends that one.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path

from rlvr.process import HEARTBEAT_DONE, is_healthy


class HealthWatch:
    """Probes every watched server's /health every `interval_s` on a daemon thread."""

    def __init__(self, *, deadline_s: float, interval_s: float | None = None, probe_s: float = 2.0) -> None:
        self.deadline_s = deadline_s
        self.interval_s = interval_s if interval_s is not None else max(0.5, min(5.0, deadline_s / 4))
        self.probe_s = min(probe_s, self.interval_s)
        self._urls: dict[str, str] = {}
        self._last_ok: dict[str, float] = {}  # name -> last answer; absent until its first since (re)start
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, name: str, url: str) -> None:
        """Watch `name` from now on (again after a restart: it must answer once before it can hang)."""
        with self._lock:
            self._urls[name] = url
            self._last_ok.pop(name, None)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rlvr-health-watch", daemon=True)
            self._thread.start()

    def forget(self, name: str) -> None:
        with self._lock:
            self._urls.pop(name, None)
            self._last_ok.pop(name, None)

    def hung(self) -> list[str]:
        """The servers silent for `deadline_s` after answering once since their start."""
        now = time.monotonic()
        with self._lock:
            return [name for name, when in self._last_ok.items() if now - when > self.deadline_s]

    def _run(self) -> None:
        while True:
            with self._lock:
                urls = list(self._urls.items())
            for name, url in urls:
                if is_healthy(url, timeout_s=self.probe_s):
                    with self._lock:
                        if name in self._urls:
                            self._last_ok[name] = time.monotonic()
            time.sleep(self.interval_s)


class HeartbeatWatch:
    """The trainer ranks' heartbeat files (`RunDir.heartbeat`) read on the launcher's own clock: a
    rank whose file changed since the trainer started and then stays unchanged for `deadline_s`
    is hung; one whose last word is `HEARTBEAT_DONE` is ending. `ranks`: the ones to watch (a
    SLURM node watches its own; None: every file in `folder`)."""

    def __init__(self, folder: Path, *, deadline_s: float, ranks: Iterable[int] | None = None) -> None:
        self.folder = folder
        self.deadline_s = deadline_s
        self.ranks = None if ranks is None else set(ranks)
        self._seen: dict[int, tuple[str, float]] = {}  # rank -> (content, when it last changed)
        self._alive: set[int] = set()  # ranks that beat since the trainer started

    def restart(self) -> None:
        """A trainer starts: what its predecessor left in the files is no beat of its own."""
        now = time.monotonic()
        self._seen = {rank: (text, now) for rank, text in self._read().items()}
        self._alive = set()

    def hung(self) -> list[int]:
        """The ranks silent for `deadline_s` after beating once since the trainer started."""
        now = time.monotonic()
        for rank, text in self._read().items():
            last = self._seen.get(rank)
            if last is None or text != last[0]:
                self._seen[rank] = (text, now)
                self._alive.add(rank)
        return sorted(
            rank
            for rank in self._alive
            if now - self._seen[rank][1] > self.deadline_s and not self._seen[rank][0].endswith(HEARTBEAT_DONE)
        )

    def _read(self) -> dict[int, str]:
        found: dict[int, str] = {}
        for path in self.folder.glob("trainer-rank*"):
            rank = path.name.removeprefix("trainer-rank")
            if not rank.isdigit() or (self.ranks is not None and int(rank) not in self.ranks):
                continue
            try:
                found[int(rank)] = path.read_text().strip()
            except OSError:
                continue
        return found
