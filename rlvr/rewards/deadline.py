"""The pool's per-call deadline counts a reward's own time, not the queue in front of it.

The judge allows `max_concurrency` requests per URL, the sandbox one run per core, the math
workers one job per process: on a busy step most calls wait for a slot first. A deadline that
ran while they waited would turn slow-but-fine answers into failures exactly when the machine
is loaded. So the pool runs each call under `asyncio.timeout`, publishes it here, and a reward
takes its shared slots through `queued(semaphore)`, which lifts the deadline while the call
waits and restores what was left once it holds the slot.

A call that waits in several places at once (code_sandbox runs its test cases concurrently)
keeps the deadline lifted while any of them waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar


class Deadline:
    """One call's `asyncio.Timeout`, paused while the call queues for a shared slot."""

    def __init__(self, timeout: asyncio.Timeout):
        self.timeout = timeout
        self.waiting = 0
        self.left: float | None = None

    def pause(self) -> None:
        self.waiting += 1
        when = self.timeout.when()
        if self.waiting == 1 and when is not None:
            self.left = max(when - asyncio.get_running_loop().time(), 0.0)
            self.timeout.reschedule(None)

    def resume(self) -> None:
        self.waiting -= 1
        if self.waiting == 0 and self.left is not None and not self.timeout.expired():
            self.timeout.reschedule(asyncio.get_running_loop().time() + self.left)
            self.left = None


current: ContextVar[Deadline | None] = ContextVar("rlvr_reward_deadline", default=None)


@contextlib.asynccontextmanager
async def queued(semaphore: asyncio.Semaphore) -> AsyncIterator[None]:
    """`async with semaphore`, with the waiting time left off the pool's deadline."""
    deadline = current.get()
    if deadline is not None:
        deadline.pause()
    try:
        await semaphore.acquire()
    finally:
        if deadline is not None:
            deadline.resume()
    try:
        yield
    finally:
        semaphore.release()


@contextlib.asynccontextmanager
async def own_time(seconds: float) -> AsyncIterator[Deadline]:
    """The pool's side: a deadline of `seconds` of the call's own time (raises TimeoutError)."""
    async with asyncio.timeout(seconds) as timeout:
        deadline = Deadline(timeout)
        token = current.set(deadline)
        try:
            yield deadline
        finally:
            current.reset(token)
