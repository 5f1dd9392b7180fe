"""Run an async call to completion from synchronous code: the trainer's thread, scripts, tests.

The embedded engine has one implementation of each call, async (as the `RolloutEngine` protocol
and the HTTP routes want it); a blocking caller hands the coroutine to `run_blocking`. It runs on
a helper thread with an event loop of its own, so it works whether or not the calling thread runs
a loop (a caller inside a loop blocks that loop, as any blocking call would).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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
