"""`rlvr launch` on this machine: rollout servers and torchrun trainer ranks as child processes.

The launcher starts each rollout server (`rlvr serve`, or SGLang on a local GPU box),
waits for its /health, registers it in the run directory, starts the trainer with
torchrun, shows the dashboard, and supervises: a child that dies stops the whole run
with the root cause from its log; Ctrl-C (or SIGTERM) asks the trainer to checkpoint and stop,
then tears every child down. Each child runs in its own process group so nothing is
left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rlvr.launch.commands import judge_command, server_command, trainer_command
from rlvr.launch.failure import root_cause
from rlvr.launch.plan import LaunchPlan, ServerSpec, make_plan
from rlvr.launch.servers import ServerAddress, clear_servers, is_healthy, register_judge, register_server
from rlvr.monitor.progress import PlainProgress
from rlvr.recipe.schema import Recipe
from rlvr.rundir import RunDir


class LaunchError(RuntimeError):
    """A child failed; one line: its name, exit code, root cause and log path."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    log: IO[bytes]

    def failure(self, what: str) -> LaunchError:
        """One line: who failed, the root cause from its log (not torchrun's banner), where the log is."""
        self.log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        return LaunchError(f"{self.name} {what}: {root_cause(text)} (log: {self.log_path})")


class LocalLauncher:
    def __init__(self, recipe: Recipe, *, run_dir: Path, resume: str = "auto", env: dict[str, str] | None = None):
        self.recipe = recipe
        self.run_dir = run_dir
        self.resume = resume
        self.plan: LaunchPlan = make_plan(recipe, master_port=_free_port())
        self.children: list[Child] = []
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        self.paths = RunDir(run_dir)
        self.paths.logs.mkdir(parents=True, exist_ok=True)

    def start(self, *, server_timeout_s: float = 300.0) -> None:
        clear_servers(self.run_dir)
        if self.recipe.judge is not None:
            judge, url = self._start_judge()
            self._wait_healthy(judge, url, timeout_s=server_timeout_s)
            register_judge(self.run_dir, url)  # the worker exports it as RLVR_JUDGE_URL
        servers = [self._start_server(spec) for spec in self.plan.servers]
        for spec, (child, url) in zip(self.plan.servers, servers, strict=True):
            self._wait_healthy(child, url, timeout_s=server_timeout_s)
            register_server(self.run_dir, ServerAddress(index=spec.index, url=url, engine=spec.engine, gpus=spec.gpus))
        self._spawn("trainer", trainer_command(self.plan, run_dir=self.run_dir, resume=self.resume))

    def _start_server(self, spec: ServerSpec) -> tuple[Child, str]:
        """Local servers take free ports: two runs on one machine must not collide."""
        port = _free_port()
        spec = ServerSpec(index=spec.index, node=spec.node, port=port, gpus=spec.gpus, engine=spec.engine)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, spec.gpus))} if spec.gpus else {}
        child = self._spawn(f"rollout-{spec.index}", server_command(self.recipe, spec), env=env)
        return child, f"http://127.0.0.1:{port}"

    def _start_judge(self) -> tuple[Child, str]:
        port = _free_port()
        return self._spawn("judge", judge_command(self.recipe, host="127.0.0.1", port=port)), f"http://127.0.0.1:{port}"

    def _spawn(self, name: str, command: list[str], *, env: dict[str, str] | None = None) -> Child:
        log_path = self.paths.log(name)
        log = log_path.open("ab")
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**self.env, **(env or {})},
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        child = Child(name=name, proc=proc, log_path=log_path, log=log)
        self.children.append(child)
        return child

    def _wait_healthy(self, child: Child, url: str, *, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child.proc.poll() is not None:
                raise child.failure(f"exited with code {child.proc.returncode} before it was healthy")
            if is_healthy(url):
                return
            time.sleep(0.3)
        raise child.failure(f"was not healthy at {url} after {timeout_s:.0f}s")

    @property
    def trainer(self) -> Child:
        return next(c for c in self.children if c.name == "trainer")

    def check(self) -> int | None:
        """None while running; the trainer's exit code when done; raises if a server died."""
        for child in self.children:
            code = child.proc.poll()
            if code is None:
                continue
            if child.name == "trainer":
                if code != 0:
                    raise child.failure(f"exited with code {code}")
                return 0
            raise child.failure(f"died with code {code}")
        return None

    def wait(self, *, poll_s: float = 0.5) -> int:
        while True:
            code = self.check()
            if code is not None:
                return code
            time.sleep(poll_s)

    def request_stop(self) -> None:
        """Ask the trainer to checkpoint and stop at the end of its step (SIGTERM to torchrun)."""
        for child in self.children:
            if child.name == "trainer" and child.proc.poll() is None:
                _signal_group(child.proc, signal.SIGTERM)

    def shutdown(self, *, grace_s: float = 30.0) -> None:
        """Trainer first (it may be saving), then the servers; SIGKILL whatever outlives grace."""
        order = sorted(self.children, key=lambda c: c.name != "trainer")
        for child in order:
            if child.proc.poll() is None:
                _signal_group(child.proc, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=grace_s if child.name == "trainer" else 5)
            _signal_group(child.proc, signal.SIGKILL)  # the group may outlive its leader
            child.proc.wait()
            child.log.close()


def run_local(recipe: Recipe, *, run_dir: Path, resume: str = "auto", dashboard: bool = True) -> int:
    """Start, watch, and always tear down; returns the trainer's exit code."""
    launcher = LocalLauncher(recipe, run_dir=run_dir, resume=resume)
    live = dashboard and sys.stdout.isatty()  # else (a log file, a pipe, --no-dashboard): a plain line per step
    plain = None if live else PlainProgress(run_dir, emit=lambda line: print(line, flush=True))
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Ctrl-C must checkpoint and tear down even when the launcher inherited SIGINT as ignored
    # (a background job of a non-interactive shell does, and Python then leaves it ignored).
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        launcher.start()
        if plain is None:
            from rlvr.monitor.dashboard import watch

            watch(run_dir, stop=lambda: launcher.check() is not None)
        else:
            plain.follow(stop=lambda: launcher.check() is not None)
        return launcher.wait()
    except KeyboardInterrupt:
        launcher.request_stop()
        with contextlib.suppress(subprocess.TimeoutExpired, StopIteration):
            launcher.trainer.proc.wait(timeout=60)
        if plain is not None:
            plain.poll()  # the steps finished while stopping
        return 130
    finally:
        launcher.shutdown()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def _die_with_parent() -> None:
    """Children get SIGTERM if the launcher itself is killed (Linux prctl PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
