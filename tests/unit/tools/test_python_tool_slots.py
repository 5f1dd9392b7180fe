"""The python tool runs at most one program per core at once, and a call's timeout starts only
once it holds a slot (a call queued behind other episodes' calls is not "timed out")."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace
from typing import Any

from rlvr.tools.base import Tool
from rlvr.tools.python import python_tool
from tests.unit.tools.conftest import toolbox


class CountingSandbox:
    """Stands in for `LocalSandbox`: each run takes `seconds` and the peak of runs at once is kept."""

    now = peak = 0
    seconds = 0.05

    def __init__(self, mode: str = "auto") -> None:
        pass

    async def run(self, files: dict[str, str], entry: str, **_: Any) -> Any:
        cls = CountingSandbox
        cls.now += 1
        cls.peak = max(cls.peak, cls.now)
        try:
            await asyncio.sleep(cls.seconds)
        finally:
            cls.now -= 1
        return SimpleNamespace(timed_out=False, stdout="ok\n", stderr="", exit_code=0)


async def test_python_programs_at_once_are_capped_at_the_cores(tokenizer, monkeypatch) -> None:
    import rlvr.sandbox.local as local

    monkeypatch.setattr(local, "LocalSandbox", CountingSandbox)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the node's cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 5, 9})  # the 3 this process may use
    CountingSandbox.now = CountingSandbox.peak = 0
    box = toolbox(tokenizer, [python_tool(timeout_s=10)], timeout_s=10)
    replies = await asyncio.gather(*(box.session().respond("<code>print(1)</code>") for _ in range(7)))
    assert all(r is not None and "ok" in r.text for r in replies)
    assert CountingSandbox.peak == 3  # 7 episodes called at once; 3 cores granted (not the node's 64)


async def test_the_wait_for_a_slot_is_not_part_of_the_call_s_timeout(tokenizer) -> None:
    slot, running = asyncio.Semaphore(1), [0, 0]  # now, peak

    async def slow(code: str) -> str:
        running[0] += 1
        running[1] = max(running)
        try:
            await asyncio.sleep(0.2)
        finally:
            running[0] -= 1
        return "done" if slot.locked() else "ran without its slot"

    params = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
    tool = Tool(name="python", description="runs code", parameters=params, fn=slow, slots=lambda: slot)
    box = toolbox(tokenizer, [tool], timeout_s=0.5)
    sessions = [box.session() for _ in range(5)]  # one at a time: the last waits 0.8 s for its slot
    replies = await asyncio.gather(*(s.respond("<code>x</code>") for s in sessions))
    assert all(r is not None and "done" in r.text for r in replies)
    assert sum(s.stats()["tool_timeouts"] for s in sessions) == 0 and running[1] == 1
