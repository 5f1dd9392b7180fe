"""An event loop on its own thread, reached from the trainer's thread by waiting calls.

The manager's state lives on this loop only, so the trainer never touches it directly: `call`
runs a coroutine there and waits for its answer. Before `start` (tests, eval-only use) the loop
runs each call inline on the caller's thread.
"""

from __future__ import annotations

import asyncio
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
        if not self.loop.is_running():
            self.loop.close()
