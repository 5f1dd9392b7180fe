"""Run untrusted Python on this machine inside bubblewrap, with rlimits and a pid namespace.

Isolation, in order of preference: `bwrap` (every namespace unshared, a fresh read-only root with
only /usr, one size-bounded tmpfs as the only writable place, no network, an empty environment; as
root, `forkserver.py` gives each run the same isolation from one warm sandbox); `unshare` when
bwrap is missing (namespaces, but the host filesystem stays visible: weaker, and said so in the
run info); neither: refuse (RuntimeError) unless `insecure` is chosen explicitly (tests, trusted
code), which runs with rlimits only. Limits come from `prlimit` on the outer process, inherited
by everything inside; as root each run gets a random unprivileged uid, so the process cap counts
only that run's processes and leftovers can be killed by uid. Output past its byte cap kills the
run. The flags and the reasons for each: docs/rewards.md (code_sandbox, local sandbox).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlvr.sandbox import Limits, RunResult
from rlvr.sandbox.forkserver import ForkServer
from rlvr.sandbox.host import SANDBOX_DIR, python_prefix, reap, root_binds, supervise

PYLIB_DIR = "/opt/rlvr-pylib"
_PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")
_modes_cache: dict[str, bool] = {}


def sandbox_python() -> str:
    """Interpreter used inside the sandbox: $RLVR_SANDBOX_PYTHON, else /usr/bin/python3, else ours.

    /usr/bin/python3 is preferred because /usr is bound anyway; our own interpreter may live
    under /root (pyenv), and binding /root would expose the host's secrets, so only its
    prefix is bound when it has to be used.
    """
    env = os.environ.get("RLVR_SANDBOX_PYTHON")
    if env:
        return env
    if os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def pytest_binds() -> list[tuple[str, str]]:
    """(host path, sandbox path) pairs that make the host's pytest importable read-only."""
    binds = []
    for name in _PYTEST_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin:
            continue
        origin = Path(spec.origin)
        src = origin.parent if origin.name == "__init__.py" else origin
        binds.append((str(src), f"{PYLIB_DIR}/{src.name}"))
    return binds


def _probe(argv: list[str]) -> bool:
    import subprocess

    try:
        return subprocess.run(argv, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def available_mode(requested: str = "auto") -> str:
    """The isolation mode to use: bwrap, unshare or insecure; RuntimeError if none works.

    `auto` probes bwrap, then unshare (once per process). `insecure` must be asked for by
    name (reward_args `sandbox_mode = "insecure"` or env RLVR_SANDBOX_INSECURE=1).
    """
    if requested == "insecure" or os.environ.get("RLVR_SANDBOX_INSECURE") == "1":
        return "insecure"
    candidates = ["bwrap", "unshare"] if requested == "auto" else [requested]
    for mode in candidates:
        if mode not in _modes_cache:
            tool = shutil.which(mode)
            if tool is None:
                _modes_cache[mode] = False
            elif mode == "bwrap":
                _modes_cache[mode] = _probe(
                    [tool, "--unshare-all", "--die-with-parent", *root_binds(), "--", "/bin/true"]
                )
            else:
                _modes_cache[mode] = _probe([tool, "--fork", "--pid", "--net", "--mount", "--", "/bin/true"])
        if _modes_cache[mode]:
            return mode
    raise RuntimeError(
        f"no sandbox available (tried {', '.join(candidates)}): install bubblewrap (`apt-get install -y bubblewrap`) "
        "or util-linux `unshare`; refusing to run model code unsandboxed. For trusted code in tests only, set "
        "reward_args sandbox_mode = 'insecure' or RLVR_SANDBOX_INSECURE=1."
    )


class LocalSandbox:
    """Runs `python -I -S -B <script>` in a fresh scratch dir under the chosen isolation."""

    def __init__(self, *, mode: str = "auto", python: str | None = None, workdir: str | None = None):
        self.mode = available_mode(mode)
        self.python = python or sandbox_python()
        self.workdir = workdir
        self._forkserver: Any = None  # started on first use (root + bwrap): see forkserver.py

    def _uid(self) -> int | None:
        if os.geteuid() != 0:
            return None
        return 100_000 + secrets.randbelow(1_000_000_000)

    def command(
        self,
        scratch: str,
        script: str,
        *,
        limits: Limits,
        uid: int | None,
        run_id: str,
        ro_binds: list[tuple[str, str]],
        args: tuple[str, ...] = (),
    ) -> list[str]:
        """The argv for one run (public so tests and docs can show exactly what is executed)."""
        cpu = int(limits.cpu_s or limits.timeout_s + 1)
        argv = [
            "prlimit",
            f"--as={limits.memory_mb * 1024 * 1024}",
            f"--cpu={max(1, cpu)}",
            f"--fsize={limits.max_file_mb * 1024 * 1024}",
            "--nofile=256",
            "--core=0",
        ]
        if uid is not None:
            argv.append(f"--nproc={limits.max_procs + 4}")  # + bwrap's own processes
        argv.append("--")
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid is not None else []
        if self.mode != "unshare":  # unshare needs root for its namespaces: it drops the uid after
            argv += drop
        inner = [self.python, "-I", "-S", "-B", script, *args]
        env = {"PATH": "/usr/bin:/bin", "HOME": SANDBOX_DIR, "LANG": "C.UTF-8", "RLVR_SANDBOX_RUN": run_id}
        if self.mode == "bwrap":
            argv += ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", *root_binds()]
            prefix = python_prefix(self.python)
            if prefix:
                argv += ["--ro-bind", prefix, prefix]
            # One size-bounded tmpfs is the only writable place (/tmp points into it); the
            # run's files are bound read-only into it, and /, /dev are remounted read-only.
            argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.max_scratch_mb * 1024 * 1024),
                     "--tmpfs", SANDBOX_DIR, "--dir", f"{SANDBOX_DIR}/.tmp", "--symlink", f"{SANDBOX_DIR}/.tmp", "/tmp"]  # fmt: skip
            for name in sorted(os.listdir(scratch)):
                argv += ["--ro-bind", os.path.join(scratch, name), f"{SANDBOX_DIR}/{name}"]
            for src, dst in ro_binds:
                argv += ["--ro-bind", src, dst]
            argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SANDBOX_DIR, "--clearenv"]
            for key, value in env.items():
                argv += ["--setenv", key, value]
            return [*argv, "--", *inner]
        env["HOME"] = scratch
        env_args = ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
        if self.mode == "unshare":
            userns = [] if uid is not None else ["--user", "--map-root-user"]
            return [*argv, "unshare", *userns, "--fork", "--pid", "--kill-child", "--mount-proc", "--net", "--ipc",
                    "--uts", "--", *drop, *env_args, *inner]  # fmt: skip
        return [*argv, *env_args, *inner]

    async def run(
        self,
        files: dict[str, str],
        script: str,
        *,
        limits: Limits,
        ro_binds: list[tuple[str, str]] | None = None,
        stdin: int | None = None,
        stdout: int | None = None,
        pass_fds: tuple[int, ...] = (),
        stop: asyncio.Event | None = None,
        args: tuple[str, ...] = (),
        trusted: bool = False,
    ) -> RunResult:
        """Write `files` into a fresh scratch dir, run `script` there, clean up; never leaks processes.

        `stdin`/`stdout` (fds) and `pass_fds` wire a run to a peer (the judge and the solution
        talk over pipes); `stop` ends the run early once its peer is done with it. `trusted` (the
        judge, which runs the dataset's tests, never model code) lets a forked run share the fork
        server's network namespace (loopback only) instead of creating its own.
        """
        uid = self._uid()
        if self.mode == "bwrap" and uid is not None and os.environ.get("RLVR_SANDBOX_FORKSERVER", "1") != "0":
            if self._forkserver is None:
                self._forkserver = ForkServer(python=self.python, ro_binds=pytest_binds())
            return await self._forkserver.run(
                files,
                script,
                limits=limits,
                uid=uid,
                stdin=stdin,
                stdout=stdout,
                pass_fds=pass_fds,
                stop=stop,
                args=args,
                share_net=trusted,
            )
        run_id = secrets.token_hex(8)
        # File I/O and the /proc sweep run on a worker thread: on the rollout manager's event loop they
        # would stall every episode and reward in flight (thousands of runs per step, next to a GPU rank).
        scratch = await asyncio.to_thread(tempfile.mkdtemp, prefix="rlvr-sbx-", dir=self.workdir)
        try:
            await asyncio.to_thread(_write_files, scratch, files, uid)
            if self.mode != "bwrap":
                ro_binds = []  # pytest only works under bwrap's binds; elsewhere the harness reports it missing
            argv = self.command(
                scratch, script, limits=limits, uid=uid, run_id=run_id, ro_binds=ro_binds or [], args=args
            )
            result = await self._execute(
                argv, cwd=scratch, limits=limits, stdin=stdin, stdout=stdout, pass_fds=pass_fds, stop=stop
            )
            result.run_id = run_id
            result.info.update({"mode": self.mode, "scratch": scratch})
            return result
        finally:
            # A cancelled caller still gets its cleanup: the thread runs to the end either way.
            await asyncio.to_thread(
                _clean_up, scratch, uid=uid, run_id=run_id, sweep=uid is not None or self.mode != "bwrap"
            )

    async def _execute(
        self,
        argv: list[str],
        *,
        cwd: str,
        limits: Limits,
        stdin: int | None,
        stdout: int | None,
        pass_fds: tuple[int, ...],
        stop: asyncio.Event | None,
    ) -> RunResult:
        start = time.perf_counter()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else stdin,
                stdout=asyncio.subprocess.PIPE if stdout is None else stdout,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                pass_fds=pass_fds,
                env={},  # the sandbox's pid 1 (bwrap) shows its environment in /proc/1/environ: give it none
            )
        finally:  # the child has its copies: ours must go, or its peer never sees end-of-file
            for fd in {fd for fd in (stdin, stdout, *pass_fds) if fd is not None}:
                os.close(fd)
        return await supervise(proc, lambda: os.killpg(proc.pid, signal.SIGKILL), limits=limits, stop=stop, start=start)


def _write_files(scratch: str, files: dict[str, str], uid: int | None) -> None:
    for name, text in files.items():
        Path(scratch, name).write_text(text)
    if uid is not None:
        for path in [scratch, *(os.path.join(scratch, n) for n in files)]:
            os.chown(path, uid, uid)


def _clean_up(scratch: str, *, uid: int | None, run_id: str, sweep: bool) -> None:
    if sweep:
        reap(uid=uid, run_id=run_id)
    shutil.rmtree(scratch, ignore_errors=True)
