"""Run the same harness in an E2B cloud sandbox (`e2b_code_interpreter.AsyncSandbox`).

One sandbox per run: created, files written with `files.write`, the harness started with
`commands.run(..., timeout=)`, then killed, so runs never share state. The key comes from
`E2B_API_KEY` (read by the SDK). Isolation and limits are E2B's (a Firecracker microVM);
our `Limits` contribute the command timeout and the output cap. The service is not reachable
from CI, so tests drive this module through a faked SDK class with the real method names.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import Any

from rlvr.sandbox import Limits, RunResult

WORKDIR = "/home/user/rlvr"


def _sdk_class() -> Any:
    """The SDK's AsyncSandbox class (a seam the tests monkeypatch)."""
    from e2b_code_interpreter import AsyncSandbox

    return AsyncSandbox


class E2BSandbox:
    def __init__(self, *, template: str | None = None):
        if not os.environ.get("E2B_API_KEY"):
            raise RuntimeError("sandbox = 'e2b' needs the E2B_API_KEY environment variable")
        self.template = template

    async def run(self, files: dict[str, str], script: str, *, limits: Limits) -> RunResult:
        from e2b import CommandExitException, TimeoutException

        start = time.perf_counter()
        sandbox = await _sdk_class().create(template=self.template, timeout=int(limits.timeout_s) + 60)
        try:
            for name, text in files.items():
                await sandbox.files.write(f"{WORKDIR}/{name}", text)
            command = f"cd {shlex.quote(WORKDIR)} && python3 -I -S -B {shlex.quote(script)}"
            killed = None
            try:
                result = await sandbox.commands.run(command, timeout=limits.timeout_s)
                exit_code, stdout, stderr = result.exit_code, result.stdout or "", result.stderr or ""
            except CommandExitException as exc:  # non-zero exit: the SDK raises, carrying the output
                exit_code, stdout, stderr = exc.exit_code, exc.stdout or "", exc.stderr or ""
            except TimeoutException:
                exit_code, stdout, stderr, killed = None, "", "", "timeout"
            if len(stdout.encode()) > limits.max_output_bytes:
                stdout, killed = stdout.encode()[: limits.max_output_bytes].decode("utf-8", "replace"), "output_limit"
            return RunResult(
                exit_code=exit_code,
                stdout=stdout,
                stderr=stderr[-limits.max_output_bytes :],
                killed=killed,
                seconds=time.perf_counter() - start,
                info={"mode": "e2b", "sandbox_id": getattr(sandbox, "sandbox_id", "")},
            )
        finally:
            await sandbox.kill()
