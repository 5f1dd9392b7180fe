"""A hung server told from a slow one: /health with a deadline, probed off the launcher's thread.

A server stopped by SIGSTOP, or deadlocked, keeps its process and its port: nothing dies, and
every request to it waits out its whole timeout. A busy server still answers /health (its HTTP
loop is not its model's), so a server that has answered once since its start and then stays
silent for `deadline_s` is hung: the launcher kills it, and it is restarted like any dead one.
"""

from __future__ import annotations

import threading
import time

from rlvr.process import is_healthy


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
