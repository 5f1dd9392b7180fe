"""`rlvr launch` on this machine: rollout servers and torchrun trainer ranks as child processes.

The launcher starts each rollout server (`rlvr serve`, vLLM or SGLang), the judge and the trainer
(torchrun) at once, registers each server in the run directory once its /health answers (the
trainer waits for that), shows the dashboard, and supervises: with `sync.on_engine_failure =
"continue"` a dead rollout server is restarted on its port (`rlvr/launch/restarts.py`) and serves
again after a full push; otherwise any dead child, Ctrl-C or SIGTERM asks the trainer to finish its
step and checkpoint before everything is torn down, with one line saying who died and why. Each
child runs in its own process group, so nothing is left behind, and gets its GPUs from the plan as
CUDA_VISIBLE_DEVICES (docs/running.md, "When something fails"; docs/cluster.md, "One machine").
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rlvr.launch.argv import (
    SERVER_MODULE_ENV,
    judge_command,
    prepare_servers,
    server_command,
    trainer_command,
)
from rlvr.launch.failure import checkpoint_note, root_cause, stated_error
from rlvr.launch.restarts import Restarts
from rlvr.monitor.metrics import event_line, mark_stopped
from rlvr.monitor.progress import PlainProgress
from rlvr.process import Child, Children, free_port
from rlvr.recipe.plan import PLAN_GPUS_ENV, LaunchPlan, ServerSpec, make_plan
from rlvr.recipe.schema import Recipe
from rlvr.rendezvous import ServerAddress, clear_servers, register_judge, register_server
from rlvr.rundir import RunDir

DRAIN_TIMEOUT_S = 300.0  # a trainer told to stop after a child died: its step and checkpoint


class LaunchError(RuntimeError):
    """A child failed; one line: its name, exit code, root cause and log path."""


def failure(child: Child, what: str) -> LaunchError:
    """One line: who failed, the root cause from its log (not torchrun's banner), where the log is."""
    code = child.proc.returncode
    if code is not None and code < 0:  # killed from outside: its log's last words are not the cause
        return LaunchError(f"{child.name} {what}: killed by {_signal_name(-code)} (log: {child.log_path})")
    try:
        text = child.log_path.read_text(errors="replace") if child.log_path is not None else ""
    except FileNotFoundError:
        text = ""
    return LaunchError(f"{child.name} {what}: {root_cause(text)} (log: {child.log_path})")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def wait_healthy(child: Child, url: str, *, timeout_s: float) -> None:
    """`Child.wait_healthy`, reported the launcher's way: one line with the root cause."""
    if child.wait_healthy(url, timeout_s=timeout_s) is None:
        return
    if child.running():
        raise failure(child, f"was not healthy at {url} after {timeout_s:.0f}s")
    raise failure(child, f"exited with code {child.proc.returncode} before it was healthy")


def start_judge(recipe: Recipe, children: Children, *, log: Path) -> tuple[Child, str]:
    """The recipe's [judge] model behind `rlvr serve` on a free local port (two runs must not collide)."""
    port = free_port()
    child = children.start("judge", judge_command(recipe, host="127.0.0.1", port=port), log=log)
    return child, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def served_judge(recipe: Recipe, *, log: Path, timeout_s: float = 300.0) -> Iterator[str]:
    """The judge as `rlvr launch` serves it, for the length of a `with` (`rlvr eval` of a judged
    domain); yields its URL, raises LaunchError if it does not come up, stops it on every exit."""
    children = Children(death_signal=signal.SIGTERM)
    try:
        child, url = start_judge(recipe, children, log=log)
        wait_healthy(child, url, timeout_s=timeout_s)
        yield url
    finally:
        children.kill_all(grace_s=10)


def gpu_env(gpus: list[int], *, parent: str | None = None) -> dict[str, str]:
    """A child's CUDA_VISIBLE_DEVICES (nothing on a CPU run: the child inherits the machine's).

    The plan numbers the GPUs this launcher sees; started with CUDA_VISIBLE_DEVICES=4,5,6,7 its
    GPU 0 is the machine's 4, so a child's list is taken from the launcher's own."""
    if not gpus:
        return {}
    parent = os.environ.get("CUDA_VISIBLE_DEVICES") if parent is None else parent
    names = [part.strip() for part in (parent or "").split(",") if part.strip()]
    ids = [names[i] if i < len(names) else str(i) for i in gpus]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}


def colocate_flags(engine: str) -> list[str]:
    """What a server needs to give its GPU memory back while a colocated trainer trains."""
    return {"vllm": ["--enable-sleep-mode"], "sglang": ["--enable-memory-saver"]}.get(engine, [])


class LocalLauncher:
    def __init__(
        self,
        recipe: Recipe,
        *,
        run_dir: Path,
        resume: str = "auto",
        env: dict[str, str] | None = None,
        prompt_tokens: int | None = None,
    ):
        """`prompt_tokens`: the longest prompt launch measured in the data (None: not measured),
        which sizes the embedded servers' KV cache (`server_command`)."""
        self.recipe = recipe
        self.prompt_tokens = prompt_tokens
        self.run_dir = run_dir
        self.resume = resume
        self.plan: LaunchPlan = make_plan(recipe, master_port=free_port())
        # SIGTERM (not SIGKILL) when the launcher dies: torchrun then stops its workers
        env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        env[PLAN_GPUS_ENV] = str(self.plan.gpus_per_node)  # children see only their GPUs: same plan
        self.children = Children(env={**os.environ, **env}, death_signal=signal.SIGTERM)
        self.paths = RunDir(run_dir)
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        self.trainer: Child | None = None
        self.servers: list[Child] = []
        self.lost: set[str] = set()  # names of servers that died in a run that goes on without them
        self.handled: set[int] = set()  # ids of dead server processes already restarted
        self.restarts = Restarts()
        self._launch: dict[str, tuple[list[str], dict[str, str]]] = {}  # server name -> its argv and env

    def start(self, *, server_timeout_s: float = 300.0) -> None:
        """Start every child at once, then register each server as it turns healthy.

        The trainer does not wait for the servers to start: it imports torch and builds its model
        while they load theirs, then waits for their registration files (`rlvr.rendezvous`).
        Started one after another, the three start-ups were most of a short run's wall clock.
        """
        clear_servers(self.run_dir)
        prepare_servers(self.recipe)
        judge = self._start_judge() if self.recipe.judge is not None else None
        servers = [self._start_server(spec) for spec in self.plan.servers]
        self.servers = [child for child, _ in servers]
        command = trainer_command(self.plan, run_dir=self.run_dir, resume=self.resume)
        self.trainer = self._spawn("trainer", command, env=gpu_env(self.plan.trainer_gpus))
        if judge is not None:
            wait_healthy(*judge, timeout_s=server_timeout_s)
            register_judge(self.run_dir, judge[1])  # the worker exports it as RLVR_JUDGE_URL
        for spec, (child, url) in zip(self.plan.servers, servers, strict=True):
            wait_healthy(child, url, timeout_s=server_timeout_s)
            register_server(self.run_dir, ServerAddress(index=spec.index, url=url, engine=spec.engine, gpus=spec.gpus))

    def _start_server(self, spec: ServerSpec) -> tuple[Child, str]:
        """Local servers take free ports: two runs on one machine must not collide."""
        port = free_port()
        spec = ServerSpec(index=spec.index, node=spec.node, port=port, gpus=spec.gpus, engine=spec.engine)
        env = gpu_env(spec.gpus)
        name, command = f"rollout-{spec.index}", server_command(self.recipe, spec, prompt_tokens=self.prompt_tokens)
        if self.plan.colocate and not os.environ.get(SERVER_MODULE_ENV):
            command += colocate_flags(spec.engine)
        self._launch[name] = (command, env)  # a restart reuses the port: its URL is the one registered
        return self._spawn(name, command, env=env), f"http://127.0.0.1:{port}"

    def _start_judge(self) -> tuple[Child, str]:
        return start_judge(self.recipe, self.children, log=self.paths.log("judge"))

    def _spawn(self, name: str, command: list[str], *, env: dict[str, str] | None = None) -> Child:
        return self.children.start(name, command, env=env, log=self.paths.log(name))

    def check(self) -> int | None:
        """None while running; the trainer's exit code when done; raises when the run must stop
        (see the module docstring: a dead server is restarted or lost in "continue" mode)."""
        self._restart_due()
        for child in list(self.children.started):
            code = child.proc.poll()
            if code is None or child.name in self.lost or id(child) in self.handled:
                continue
            if child is self.trainer:
                if code != 0:
                    stated = stated_error(self.run_dir)
                    raise LaunchError(stated) if stated else failure(child, f"exited with code {code}")
                return 0
            server = any(child is s for s in self.servers)
            if server and self.recipe.sync.on_engine_failure == "continue":
                plan = self.restarts.died(child.name)
                if plan is not None:
                    self.handled.add(id(child))
                    self._say(f"{failure(child, f'died with code {code}')}; {plan}")
                    continue
                if self._servers_up():
                    self._lose(child, code)
                    continue
            raise self._drained(failure(child, f"died with code {code}"))
        return None

    def _restart_due(self) -> None:
        for name in self.restarts.due():
            command, env = self._launch[name]
            fresh = self._spawn(name, command, env=env)
            self.servers = [fresh if s.name == name else s for s in self.servers]
            self._say(f"{name} restarted (pid {fresh.pid})", level="warning")

    def _drained(self, error: LaunchError) -> LaunchError:
        """Before the run stops for `error`: the trainer finishes its step (or fails on the dead
        server, which it does with a checkpoint too) and saves; the line says what was kept."""
        if self.trainer is not None and self.trainer.running():
            self.stop_trainer(timeout_s=DRAIN_TIMEOUT_S)
        return LaunchError(f"{error}{checkpoint_note(self.run_dir)}")

    def _say(self, message: str, *, level: str = "error") -> None:
        print(message, file=sys.stderr, flush=True)
        with open(self.paths.events, "a") as events:
            events.write(event_line(message, level=level))

    def _servers_up(self) -> int:
        return sum(1 for s in self.servers if s.running())

    def _lose(self, child: Child, code: int) -> None:
        self.lost.add(child.name)
        up = self._servers_up()
        self._say(f"{failure(child, f'died with code {code}')}; the run goes on with {up} rollout server(s)")

    def wait(self, *, poll_s: float = 0.5) -> int:
        while True:
            code = self.check()
            if code is not None:
                return code
            time.sleep(poll_s)

    def stop_trainer(self, *, timeout_s: float) -> None:
        """Ask the trainer's ranks to finish their step and checkpoint (SIGUSR1 to torchrun's
        workers, not SIGTERM to torchrun: its 30 s kill clock would cut a long step or save
        short), and wait; a second Ctrl-C (or SIGTERM) gives up on it."""
        if self.trainer is None or not self.trainer.running():
            return
        self.trainer.signal_workers(signal.SIGUSR1)
        with contextlib.suppress(subprocess.TimeoutExpired, KeyboardInterrupt):
            self.trainer.proc.wait(timeout=timeout_s)

    def shutdown(self, *, grace_s: float = 30.0) -> None:
        """Trainer first (it may be saving), then every server at once (each takes a second or
        two to drain); SIGKILL whatever outlives its grace."""
        if self.trainer is not None:
            self.children.stop(self.trainer, grace_s=grace_s)
        self.children.kill_all(grace_s=5)


def run_local(
    recipe: Recipe,
    *,
    run_dir: Path,
    resume: str = "auto",
    dashboard: bool = True,
    stop_timeout_s: float = 900.0,
    prompt_tokens: int | None = None,
) -> int:
    """Start, watch, and always tear down; returns the trainer's exit code (130 after Ctrl-C).

    `stop_timeout_s` bounds the wait for a stopping trainer: a step plus its checkpoint, never
    a hung rank forever.
    """
    launcher = LocalLauncher(recipe, run_dir=run_dir, resume=resume, prompt_tokens=prompt_tokens)
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
        print("stopping: the trainer finishes its step and saves a checkpoint (Ctrl-C again to stop now)",
              file=sys.stderr, flush=True)  # fmt: skip
        launcher.stop_trainer(timeout_s=stop_timeout_s)
        mark_stopped(run_dir)  # the trainer's own word if it got to write one
        if plain is not None:
            plain.poll()  # the steps finished while stopping
        return 130
    finally:
        launcher.shutdown()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
