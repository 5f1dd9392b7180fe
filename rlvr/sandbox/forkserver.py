"""Host side of the fork server (`zygote.py`): one warm sandbox that forks every run.

Per run we write its files into a private spool dir (bound read-only into the zygote),
create its pipes, and hand the zygote the request plus the run's fds over a SOCK_SEQPACKET
socket (SCM_RIGHTS). The zygote answers with the exit status; a reader thread routes it to
the waiting coroutine on whichever event loop started the run. Each run still gets its own
pid/mount/net/ipc/uts namespaces, a fresh uid, its rlimits, an empty environment and its own
size-bounded tmpfs: what is saved is the bwrap and interpreter start per run.
Needs root (the zygote hands out uids); elsewhere LocalSandbox starts one bwrap per run.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from importlib import resources
from pathlib import Path

from rlvr.sandbox import Limits, RunResult
from rlvr.sandbox.host import SANDBOX_DIR, python_prefix, reap, root_binds, supervise


class ForkServer:
    def __init__(self, *, python: str, ro_binds: list[tuple[str, str]]):
        self.python = python
        self.ro_binds = ro_binds
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.pending: dict[str, asyncio.Future] = {}
        self.starts = 0  # zygotes started: a start after the first means the last one died
        self.lock = threading.Lock()
        self.spool = ""

    def _start(self) -> None:
        self.starts += 1
        if not self.spool or not os.path.isdir(self.spool):  # a restart keeps it: runs may have written there
            self.spool = tempfile.mkdtemp(prefix="rlvr-spool-")
        zygote = Path(self.spool).with_name(Path(self.spool).name + "-zygote.py")
        zygote.write_text(resources.files("rlvr.sandbox").joinpath("zygote.py").read_text())
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--cap-add", "ALL", *root_binds()]  # fmt: skip
        prefix = python_prefix(self.python)
        if prefix:
            argv += ["--ro-bind", prefix, prefix]
        argv += ["--proc", "/proc", "--dev", "/dev", "--dir", SANDBOX_DIR, "--symlink", f"{SANDBOX_DIR}/.tmp", "/tmp",
                 "--ro-bind", self.spool, "/spool", "--ro-bind", str(zygote), "/zygote.py"]  # fmt: skip
        for parent in sorted({os.path.dirname(dst) for _, dst in self.ro_binds}):  # as root, bwrap makes 0700 dirs
            argv += ["--perms", "0755", "--dir", os.path.dirname(parent), "--perms", "0755", "--dir", parent]
        for src, dst in self.ro_binds:
            argv += ["--ro-bind", src, dst]
        argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--clearenv", "--",
                 self.python, "-I", "-S", "-B", "/zygote.py", str(theirs.fileno())]  # fmt: skip
        self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), env={}, stdin=subprocess.DEVNULL)
        atexit.register(self.close)  # the zygote dies with us (--die-with-parent); the spool must go too
        theirs.close()
        self.sock = ours
        threading.Thread(target=self._read_replies, args=(ours, self.proc), daemon=True).start()

    def _read_replies(self, sock: socket.socket, proc: subprocess.Popen) -> None:
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            reply = json.loads(data)
            future = self.pending.pop(reply["id"], None)
            if future is not None and not future.done():
                future.get_loop().call_soon_threadsafe(_settle, future, reply["exit"])
        with self.lock:  # the zygote is gone: fail what waits, start afresh next time
            if self.proc is proc:
                self.proc, self.sock = None, None
            pending, self.pending = self.pending, {}
        for future in pending.values():
            future.get_loop().call_soon_threadsafe(_settle, future, LOST)

    def _send(self, message: dict, fds: list[int]) -> bool:
        """Hand `message` (and `fds`) to the zygote; True when it had died and was started again."""
        restarted = False
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                restarted = self.starts > 0
                self._start()
            assert self.sock is not None
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            self.sock.sendmsg([json.dumps(message).encode()], ancillary)
        return restarted

    async def run(
        self,
        files: dict[str, str],
        script: str,
        *,
        limits: Limits,
        uid: int,
        stdin: int | None = None,
        stdout: int | None = None,
        pass_fds: tuple[int, ...] = (),
        stop: asyncio.Event | None = None,
        args: tuple[str, ...] = (),
        share_net: bool = False,
    ) -> RunResult:
        start = time.perf_counter()
        run_id = secrets.token_hex(8)
        loop = asyncio.get_running_loop()
        spool = ""
        theirs: list[int] = []
        try:
            # Started on this thread, once: its parent-death signal follows the thread that spawned it,
            # and a worker thread that exits would take the fork server with it.
            spool = os.path.join(self.spool or self._ensure_spool(), run_id)
            # The spool's files and (below) the /proc sweep: on a worker thread, never on the rollout
            # manager's event loop (every episode and reward in flight waits there).
            await asyncio.to_thread(_write_spool, spool, files)
            out_r, out_w = os.pipe() if stdout is None else (None, stdout)
            err_r, err_w = os.pipe()
            theirs = [os.open(os.devnull, os.O_RDONLY) if stdin is None else stdin, out_w, err_w, *pass_fds]
            done: asyncio.Future = loop.create_future()
            self.pending[run_id] = done
            cpu = int(limits.cpu_s or limits.timeout_s + 1)
            moved = {str(fd): str(3 + i) for i, fd in enumerate(pass_fds)}  # pass_fds land at 3, 4, ... in the run
            request = {"id": run_id, "spool": run_id, "uid": uid, "script": script, "args": [moved.get(a, a) for a in args],
                       "precompile": [n for n in files if n.startswith("_rlvr_") and n.endswith(".py")], "share_net": share_net,
                       "limits": {"memory_mb": limits.memory_mb, "cpu_s": max(1, cpu), "max_file_mb": limits.max_file_mb,
                                  "max_procs": limits.max_procs, "max_scratch_mb": limits.max_scratch_mb}}  # fmt: skip
            restarted = self._send(request, theirs)
        finally:
            for fd in set(theirs) | ({stdin, stdout, *pass_fds} - {None}):
                with contextlib.suppress(OSError):
                    os.close(fd)  # pyright: ignore[reportArgumentType]
        proc = _ForkedRun(done, await _reader(out_r, loop), await _reader(err_r, loop))

        def kill() -> None:
            with contextlib.suppress(OSError):
                self._send({"kill": run_id}, [])

        clean = False
        try:
            result = await supervise(proc, kill, limits=limits, stop=stop, start=start)
            clean = not result.killed and result.exit_code is not None and result.exit_code >= 0
        finally:
            self.pending.pop(run_id, None)
            # a clean exit of the run's pid 1 already took its namespace down: no sweep then
            await asyncio.to_thread(_clean_up, spool, uid=uid, run_id=run_id, sweep=not clean)
        if result.exit_code == LOST:
            result.killed, result.exit_code = "sandbox_lost", None
            result.info["cause"] = "the sandbox's fork server died"
        elif result.exit_code == SETUP_FAILED and result.killed is None:
            result.killed = "sandbox_setup"
            said = _last_line(result.stderr)
            result.info["cause"] = "the sandbox could not set up the run" + (f": {said}" if said else "")
        result.run_id = run_id
        result.info.update({"mode": "bwrap-forkserver", **({"sandbox_restarted": True} if restarted else {})})
        return result

    def _ensure_spool(self) -> str:
        with self.lock:
            if self.proc is None:
                self._start()
        return self.spool

    def close(self) -> None:
        with self.lock:
            proc, sock, spool = self.proc, self.sock, self.spool
            self.proc, self.sock, self.spool = None, None, ""
        if proc is not None:
            proc.kill()
            proc.wait()
        if sock is not None:
            sock.close()
        if spool:
            shutil.rmtree(spool, ignore_errors=True)
            Path(spool + "-zygote.py").unlink(missing_ok=True)


def _write_spool(spool: str, files: dict[str, str]) -> None:
    os.mkdir(spool, 0o700)
    for name, text in files.items():
        Path(spool, name).write_text(text)


def _clean_up(spool: str, *, uid: int, run_id: str, sweep: bool) -> None:
    if sweep:
        reap(uid=uid, run_id=run_id)
    shutil.rmtree(spool, ignore_errors=True)


SETUP_FAILED = 125  # zygote.py: the run's namespace could not be set up (the relay alone says so)
LOST = -1000  # no real exit status: the zygote died with the run pending


def _settle(future: asyncio.Future, code: int) -> None:
    if not future.done():
        future.set_result(-(code - 128) if code > 128 else code)


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")[:200]


async def _reader(fd: int | None, loop: asyncio.AbstractEventLoop) -> asyncio.StreamReader | None:
    if fd is None:
        return None
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    return reader


class _ForkedRun:
    """The bits of asyncio.subprocess.Process that `supervise` uses, for a forked run."""

    def __init__(self, done: asyncio.Future, stdout: asyncio.StreamReader | None, stderr: asyncio.StreamReader | None):
        self.done, self.stdout, self.stderr = done, stdout, stderr

    @property
    def returncode(self) -> int | None:
        return self.done.result() if self.done.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self.done)
