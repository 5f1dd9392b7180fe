"""The host side of a sandboxed run on this machine, shared by `LocalSandbox` (one bwrap per run,
`local.py`) and the fork server (`forkserver.py`): the read-only root and the interpreter prefix both
bind, watching a run's output and wall time (`supervise`), and killing what a run leaves (`reap`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Protocol

from rlvr.sandbox import Limits, RunResult

SANDBOX_DIR = "/sandbox"


def python_prefix(python: str) -> str | None:
    """The directory to bind for an interpreter outside /usr (its install prefix)."""
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return None
    prefix = os.path.dirname(os.path.dirname(real))
    return prefix if prefix not in ("/", "") else os.path.dirname(real)


def root_binds() -> list[str]:
    """bwrap's arguments for the read-only root every sandbox gets: /usr, and /lib, /lib64, /bin, /sbin
    as this machine has them (a symlink stays a symlink)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/lib", "/lib64", "/bin", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


class _Proc(Protocol):
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


async def supervise(
    proc: _Proc, hard_kill: Callable[[], None], *, limits: Limits, stop: asyncio.Event | None, start: float
) -> RunResult:
    """Read a run's output under the caps, enforce the wall timeout, kill it early on `stop`."""
    killed: list[str] = []

    def kill(reason: str) -> None:
        if not killed:
            killed.append(reason)
        with contextlib.suppress(ProcessLookupError):
            hard_kill()

    async def read(stream: asyncio.StreamReader | None, cap: int, reason: str) -> bytes:
        buf = bytearray()
        if stream is None:
            return b""
        while chunk := await stream.read(65536):  # drain to EOF even past the cap: closes the transport
            if len(buf) + len(chunk) > cap and not killed:
                kill(reason)
            buf += chunk[: max(0, cap - len(buf))]
        return bytes(buf)

    async def stopped() -> None:
        if stop is not None:
            await stop.wait()
            await asyncio.sleep(0.05)  # let it exit on its own first (its pipe closed)
            if proc.returncode is None:
                kill("stopped")

    cap = limits.max_output_bytes
    tasks = asyncio.gather(read(proc.stdout, cap, "stdout_limit"), read(proc.stderr, cap, "stderr_limit"), proc.wait())
    stopper = asyncio.ensure_future(stopped())
    try:
        out, err, _ = await asyncio.wait_for(asyncio.shield(tasks), timeout=limits.timeout_s)
    except TimeoutError:
        kill("timeout")
        try:  # a stray holding the pipes open (weaker modes) must not hang us: reap() follows
            out, err, _ = await asyncio.wait_for(tasks, timeout=5)
        except TimeoutError:
            out, err = b"", b""
    except asyncio.CancelledError:
        kill("cancelled")
        await asyncio.shield(proc.wait())
        raise
    finally:
        stopper.cancel()
        if proc.returncode is None:
            kill("cleanup")
            await proc.wait()
    return RunResult(
        exit_code=proc.returncode,
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        killed=killed[0] if killed else None,
        seconds=time.perf_counter() - start,
    )


def reap(*, uid: int | None, run_id: str) -> int:
    """Kill any process left by a run (found by its uid, or the run id in its environment).

    Under bwrap the pid namespace already guarantees this; the sweep is the guarantee for
    the weaker modes and a belt-and-braces check for the strong one. Returns how many died.
    """
    killed = 0
    marker = f"RLVR_SANDBOX_RUN={run_id}".encode()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if uid is not None:
                with open(f"/proc/{entry.name}/status", "rb") as f:
                    status = f.read()
                match = f"\nUid:\t{uid}\t".encode() in status
            else:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    match = marker in f.read()
            if match:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except (OSError, ValueError):
            continue
    return killed
