"""Async code reached from synchronous code: the trainer's thread, scripts, tests.

`LoopThread` is an event loop on its own daemon thread that owns some state (the rollout
manager's, the weight sync's HTTP sessions): `call` runs a coroutine there and waits, `submit`
returns its future. Before `start` (tests, eval-only use) `call` runs inline on the caller's
thread. `run_blocking` runs one coroutine to completion on a fresh loop, for objects whose async
methods need no loop of their own (the embedded engine), whether or not the caller runs a loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An asyncio loop that `start` moves onto a daemon thread named `name`."""

    def __init__(self, *, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.loop.run_forever, name=self.name, daemon=True)
            self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def submit(self, coro: Coroutine[Any, Any, T]) -> cf.Future[T]:
        """Run `coro` on the loop's thread (started now if it was not); its future."""
        self.start()
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for its result."""
        if self._thread is None:  # not started: run inline
            return self.loop.run_until_complete(coro)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        """Stop the loop's thread (it was started)."""
        if self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    def close(self) -> None:
        """Close the loop once it no longer runs."""
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()


def run_blocking(call: Coroutine[Any, Any, T]) -> T:
    """`call`'s result, or its exception, once it has run on a fresh event loop."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = asyncio.run(call)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    # A daemon thread: a caller interrupted while it waits (Ctrl-C) is not held at exit by it.
    thread = threading.Thread(target=run, name="rlvr-run-blocking", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
