"""The `python` tool: run the model's code in the reward sandbox and answer with its output.

Same isolation and limits as `code_sandbox` (`LocalSandbox`), stateless per call: every call is a
fresh interpreter in a fresh scratch directory, so one call's variables or files never leak into
the next. With `python_session = true` the calls of one episode share state the simplest way that
keeps that isolation: each call replays the episode's earlier cells first, output hidden and errors
ignored (`session_script`). At most one program per core runs at once in this process (`slots`),
since every episode of a step may call the tool together; a call's timeout starts once it has a
slot. docs/tools.md ("python").
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from rlvr.tools.base import Tool

STDERR_TAIL = 1500

_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def slots() -> asyncio.Semaphore:
    """This event loop's cap on python tool programs running at once: one per core this process may
    use (its affinity, not the node's count), shared by every python tool (every domain) on the loop."""
    from rlvr.recipe.machine import cpu_cores

    loop = asyncio.get_running_loop()
    if loop not in _slots:
        _slots[loop] = asyncio.Semaphore(cpu_cores())
    return _slots[loop]


def session_script(cells: list[str], code: str) -> str:
    """A program that replays `cells` silently, then runs `code` (its output and errors shown)."""
    if not cells:
        return code
    lines = ["import contextlib as _c, io as _io", "_g = {'__name__': '__main__'}"]
    for i, cell in enumerate(cells, 1):
        lines.append("with _c.redirect_stdout(_io.StringIO()), _c.redirect_stderr(_io.StringIO()):")
        lines.append(f"    try: exec(compile({cell!r}, '<cell {i}>', 'exec'), _g)")
        lines.append("    except BaseException: pass")
    lines.append(f"exec(compile({code!r}, '<cell {len(cells) + 1}>', 'exec'), _g)")
    return "\n".join(lines) + "\n"


def python_tool(*, timeout_s: float, memory_mb: int = 512, sandbox_mode: str = "auto", session: bool = False) -> Tool:
    sandbox: list[Any] = []  # built on first call: probing the isolation modes runs processes

    async def run(code: str) -> str:
        from rlvr.sandbox import Limits
        from rlvr.sandbox.local import LocalSandbox

        if not sandbox:
            sandbox.append(LocalSandbox(mode=sandbox_mode))
        limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=64 * 1024)
        result = await sandbox[0].run({"main.py": code}, "main.py", limits=limits)
        if result.timed_out:
            raise TimeoutError(f"the program ran past {timeout_s:g}s")
        out = result.stdout
        if result.exit_code != 0:
            out += result.stderr[-STDERR_TAIL:]
        return out if out.strip() else "(no output: print() what you need)"

    return Tool(
        name="python",
        description="Run a Python program and return what it prints "
        + ("(variables persist across this episode's calls)." if session else "(a fresh interpreter each call)."),
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The program to run."}},
            "required": ["code"],
        },
        fn=run,
        own_timeout=True,
        slots=slots,
    )
