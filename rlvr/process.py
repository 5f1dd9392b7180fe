"""Child processes: start one with a log file, have it die with its parent, poll its health,
and take down its whole process tree.

The local launcher, the SLURM node script and the reward worker pool all start processes that must
not outlive the run (a server left behind holds a GPU and a port, a stuck sympy worker a core). So
every child gets, once, here: its own session (process group), a parent-death signal
(`PR_SET_PDEATHSIG`), a mark in its environment that every descendant inherits (`TREE_ENV`), and a
place in a `Children` set whose `kill_all` SIGTERMs every process of every tree, waits a grace
period and SIGKILLs what is left, grandchildren re-parented away included. `Children.stop` ends one
child's whole tree and waits until it is gone: torchrun starts its workers in sessions of their own,
so a worker whose agent was SIGKILLed is outside the agent's group and tree, and only its mark
still says whose it is. A process that must go with its parent calls `stay_with_parent` (the
trainer's workers: a worker whose agent died would otherwise train on beside the next trainer).

Nothing here imports the rest of rlvr: launchers and `rlvr.rewards` both sit above it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

LOG_TAIL_LINES = 25
PR_SET_PDEATHSIG = 1


TREE_ENV = "RLVR_PROCESS_TREE"
"""Set by `Children.start` to a value of that child's own; every descendant inherits it. How a
process of the tree is found after it left the child's session and lost its parent."""
KILL_WAIT_S = 10.0
"""How long `Children.stop` waits for SIGKILLed processes to be gone before it says which are not."""


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` to this process when its parent dies (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def stay_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Get `sig` when the parent dies, from now on; False when the parent is already gone (then
    the signal never comes, and the caller must exit itself).

    The parent is read before the request and again after it: one that died in between has
    handed this process to init (or a subreaper). One that died before the first read shows as
    a parent outside this process's tree: without the `TREE_ENV` mark this process inherited
    (init's environment is not even readable), or pid 1 where there is no mark."""
    parent = os.getppid()
    die_with_parent(sig)
    if os.getppid() != parent:
        return False
    mark = os.environ.get(TREE_ENV)
    if mark is None:
        return parent != 1
    try:
        return psutil.Process(parent).environ().get(TREE_ENV) == mark
    except psutil.Error:
        return False


def marked(mark: str) -> set[int]:
    """Every live process on this machine whose environment carries `TREE_ENV=mark` (ours to see)."""
    found: set[int] = set()
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TREE_ENV) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except psutil.Error:  # gone, or another user's
            continue
    return found


OPEN_FILES_CAP = 1 << 20
"""Where an unlimited hard limit is capped: Linux's default `fs.nr_open`, above which the kernel
refuses any RLIMIT_NOFILE."""


def raise_open_files_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; the soft limit it ends with.

    Why: rank 0 holds a socket per in-flight rollout request and judge connection, a pipe or
    two per sandbox, and the engines' servers one socket per client; the common soft default
    of 1024 runs out at a big recipe's shape ("Too many open files"), while the hard limit
    (often 2^20 or more) is there for the asking. An unlimited hard limit is capped at
    `OPEN_FILES_CAP` (and then at 10240, macOS's OPEN_MAX) where the kernel refuses more. A
    platform without `resource` keeps its limit (returns -1). Children inherit the raised limit.
    """
    try:
        import resource
    except ImportError:  # not POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES_CAP if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft >= target:
        return soft
    for value in (target, min(target, OPEN_FILES_CAP), min(target, 10240)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (value, hard))
            return value
        except (ValueError, OSError):
            continue
    return soft


def _child_setup(death_signal: int, ignored: tuple[int, ...]) -> None:
    """Runs in the child between fork and exec. Ignored signals stay ignored through exec (a
    child that installs its own handler still gets them)."""
    for sig in ignored:
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent(death_signal)


HEARTBEAT_DONE = "done"
"""A heartbeat's last word when its process ends on its own terms: silence after it is no hang."""


def heartbeat_interval(deadline_s: float) -> float:
    """How often to beat for a watcher with `deadline_s`: five beats a deadline, 0.2-5 s apart."""
    return max(0.2, min(5.0, deadline_s / 5))


class Heartbeat:
    """Rewrites `path` every `interval_s` from a daemon thread of its own, with a count that grows:
    a process stopped whole (SIGSTOP, a frozen machine) stops beating, a slow one does not (its
    main thread may be deep in a step). What a trainer rank has where a server has /health."""

    def __init__(self, path: Path, *, interval_s: float) -> None:
        self.path = path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlvr-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        beat = 0
        while not self._stop.is_set():
            beat += 1
            with contextlib.suppress(OSError):  # a full or lost disk: the watcher sees silence
                self.path.write_text(f"{os.getpid()} {beat}\n")
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Stop beating and say so (`HEARTBEAT_DONE`): the process is ending, not hung."""
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.path.write_text(f"{os.getpid()} {HEARTBEAT_DONE}\n")


def is_healthy(url: str, *, timeout_s: float = 2.0) -> bool:
    """GET {url}/health answers 200 (SGLang and `rlvr serve` both have the route)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ("" when there is none yet)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def tree(pid: int) -> list[int]:
    """Every live descendant of `pid` (children, grandchildren, ...); [] when it is gone."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def children_of(pid: int) -> list[int]:
    """The direct children of `pid`; [] when it is gone."""
    try:
        return [p.pid for p in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def is_alive(pid: int) -> bool:
    """`pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def is_stopped(pid: int) -> bool:
    """`pid` is stopped (SIGSTOP, SIGTSTP, a debugger): it runs no code until SIGCONT."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def send(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def send_group(pid: int, sig: int) -> None:
    """`sig` to the process group `pid` leads (every child here leads its own)."""
    with contextlib.suppress(OSError):
        os.killpg(pid, sig)


@dataclass
class Child:
    """One started process: its name (for messages), the Popen, and where its output goes."""

    name: str
    proc: subprocess.Popen
    log_path: Path | None = None
    mark: str = ""  # its TREE_ENV value ("": started without one)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def members(self) -> set[int]:
        """Every live process of this child's tree: itself, its descendants, and every process
        that carries its mark (a grandchild in a session of its own whose parent died included)."""
        found = {self.pid, *tree(self.pid)} if self.running() else set()
        if self.mark:
            found |= marked(self.mark)
        return {pid for pid in found if is_alive(pid)}

    def running(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of its log ("" without one): what a user needs to see why it died."""
        return log_tail(self.log_path, lines) if self.log_path is not None else ""

    def signal_workers(self, sig: int) -> None:
        """`sig` to this child's own children (torchrun's workers), or to the child without any.

        torchrun dies on SIGUSR1 without passing it on, and answers SIGTERM by killing its
        workers 30 s later; a stop request must reach the worker processes directly: they
        checkpoint and exit, and torchrun follows.
        """
        for pid in children_of(self.pid) or [self.pid]:
            send(pid, sig)

    def wait_healthy(self, url: str, *, timeout_s: float, poll_s: float = 0.3) -> str | None:
        """Poll {url}/health until it answers; None then, else why not (exited, or timed out)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running():
                return f"{self.name} exited with code {self.proc.returncode}; last lines of {self.log_path}:\n{self.tail()}"
            if is_healthy(url):
                return None
            time.sleep(poll_s)
        return f"{self.name} was not healthy at {url} after {timeout_s:.0f}s:\n{self.tail()}"


class Children:
    """The processes one parent started; every exit path of the parent goes through `kill_all`.

    `death_signal`: what a child gets when the parent dies. `ignore`: signals the children
    start with ignored (a SLURM step signals every process; a child without a handler would
    die of the time-limit warning meant for the trainer worker).
    """

    def __init__(
        self, *, env: Mapping[str, str] | None = None, death_signal: int = signal.SIGKILL, ignore: Sequence[int] = ()
    ):
        self.env = dict(os.environ if env is None else env)
        self.death_signal = death_signal
        self.ignore = tuple(ignore)
        self.started: list[Child] = []
        self.known: set[int] = set()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        cwd: Path | None = None,
    ) -> Child:
        """Start `argv` in its own session; stdout and stderr appended to `log` (inherited without)."""
        out = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            out = log.open("ab")
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
        mark = f"{os.getpid()}-{len(self.started)}-{name}-{time.time_ns()}"
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env={**self.env, **(env or {}), TREE_ENV: mark},
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
                preexec_fn=functools.partial(_child_setup, self.death_signal, self.ignore),
            )
        finally:
            if out is not None:
                out.close()  # the child holds its own descriptor
        child = Child(name=name, proc=proc, log_path=log, mark=mark)
        self.started.append(child)
        return child

    def alive(self) -> list[Child]:
        return [c for c in self.started if c.running()]

    def snapshot(self) -> set[int]:
        """Remember every descendant now: an orphan escapes a later walk from our children."""
        for child in self.alive():
            self.known |= {child.pid, *tree(child.pid)}
        return self.known

    def signal_workers(self, sig: int) -> None:
        """`Child.signal_workers` for every live child (SLURM's time-limit warning)."""
        for child in self.alive():
            child.signal_workers(sig)

    def signal_all(self, sig: int) -> None:
        self.snapshot()
        for child in self.alive():
            send_group(child.pid, sig)
        for child in self.started:  # a dead child's tree too: its workers may have outlived it
            self.known |= child.members()
        for pid in self.known:
            send(pid, sig)

    def stop(self, child: Child, *, grace_s: float, kill_wait_s: float = KILL_WAIT_S) -> list[int]:
        """End one child's whole tree and wait until it is gone: SIGTERM its group and every
        process of its tree (`Child.members`), wait up to `grace_s` (0: SIGKILL at once), SIGKILL
        what is left, reap. Returns the pids still alive `kill_wait_s` after the SIGKILL ([]
        unless one cannot die, e.g. stuck in the kernel): a caller about to start its successor
        must not then."""
        members = child.members()
        if grace_s > 0 and (child.running() or members):
            send_group(child.pid, signal.SIGTERM)
            for pid in members:
                send(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and (child.running() or any(is_alive(p) for p in members)):
                time.sleep(0.05)
        left = members | child.members()
        send_group(child.pid, signal.SIGKILL)
        for pid in left:
            send(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=kill_wait_s)
        deadline = time.monotonic() + kill_wait_s
        while time.monotonic() < deadline and any(is_alive(p) for p in left):
            time.sleep(0.05)
        return sorted(p for p in left if is_alive(p))

    def kill_all(self, *, grace_s: float) -> None:
        """SIGTERM every process of every tree, wait up to `grace_s`, then SIGKILL what is left."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (self.alive() or any(is_alive(p) for p in self.known)):
            time.sleep(0.1)
        self.signal_all(signal.SIGKILL)
        for child in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=5)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (two runs on one machine must not collide)."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
