"""Rollout servers' supervisor, one for the local launcher and the SLURM node.

A `ServerLaunch` is everything a server is started (and restarted) with: its argv
(`rlvr.launch.argv`), its env (the plan's GPUs mapped through the parent's CUDA_VISIBLE_DEVICES),
its name `rollout-<index>` (its log `logs/rollout-<index>.log`, as docs/running.md names it) and
the URL it registers; the recipe's judge is launched beside them. `ServerSupervisor` starts them,
probes /health, kills a hung one (`rlvr/launch/health.py`), reports each death once and restarts a
dead server on its own port with the same argv and env, bounded and spaced (`restarts.py`): its URL
stays valid, and a rollout server is registered again with a new instance before it starts, so the
trainer knows it for a new process. What a death means for the run is the launcher's call.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.launch.argv import SERVER_MODULE_ENV, judge_command, server_command
from rlvr.launch.failure import LaunchError, failure
from rlvr.launch.health import HealthWatch
from rlvr.launch.restarts import Restarts
from rlvr.process import Child, Children, is_healthy, send_group
from rlvr.recipe.plan import ServerSpec
from rlvr.recipe.schema import Recipe
from rlvr.rendezvous import ServerAddress, register_judge, register_server
from rlvr.rundir import GENERATION_FILE_ENV, RunDir

JUDGE = "judge"


def server_name(index: int) -> str:
    """A rollout server's name in messages and its log file's: one rule on every launcher."""
    return f"rollout-{index}"


def visible_devices(gpus: Sequence[int], *, parent: str | None = None) -> dict[str, str]:
    """A child's CUDA_VISIBLE_DEVICES for plan GPUs `gpus` (nothing without GPUs: it inherits).

    The plan numbers the GPUs its launcher sees: started with CUDA_VISIBLE_DEVICES=4,5,6,7 (a
    SLURM job holding physical GPUs 4-7), plan GPU 0 is the machine's 4, so a child's list is
    taken from the parent's own (`parent`: default this process's)."""
    if not gpus:
        return {}
    parent = os.environ.get("CUDA_VISIBLE_DEVICES") if parent is None else parent
    names = [part.strip() for part in (parent or "").split(",") if part.strip()]
    if not names:
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}
    if any(g >= len(names) for g in gpus):
        raise LaunchError(f"plan GPUs {list(gpus)} but this node only sees CUDA_VISIBLE_DEVICES={parent}")
    return {"CUDA_VISIBLE_DEVICES": ",".join(names[g] for g in gpus)}


def colocate_flags(engine: str) -> list[str]:
    """What a server needs to give its GPU memory back while a colocated trainer trains."""
    return {"vllm": ["--enable-sleep-mode"], "sglang": ["--enable-memory-saver"]}.get(engine, [])


@dataclass(frozen=True)
class ServerLaunch:
    """One server as started and restarted: same argv, env and port every time."""

    name: str
    argv: list[str]
    env: dict[str, str]
    url: str
    spec: ServerSpec | None = None  # None: the judge (not a rollout server)


def rollout_launch(
    recipe: Recipe,
    spec: ServerSpec,
    *,
    host: str = "127.0.0.1",
    advertise: str = "127.0.0.1",
    colocate: bool = False,
    prompt_tokens: int | None = None,
    env: Mapping[str, str] | None = None,
) -> ServerLaunch:
    """Rollout server `spec`, bound to `host` and reached at `advertise` (`env`: added to its own)."""
    argv = server_command(recipe, spec, host=host, prompt_tokens=prompt_tokens)
    if colocate and not os.environ.get(SERVER_MODULE_ENV):  # a stand-in server takes no engine flags
        argv += colocate_flags(spec.engine)
    env = {**(env or {}), **visible_devices(spec.gpus)}
    return ServerLaunch(server_name(spec.index), argv, env, f"http://{advertise}:{spec.port}", spec)


def judge_launch(
    recipe: Recipe,
    *,
    port: int,
    host: str = "127.0.0.1",
    advertise: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
) -> ServerLaunch:
    """The recipe's [judge] model behind `rlvr serve` (on the CPU: it inherits no GPU list)."""
    return ServerLaunch(
        JUDGE, judge_command(recipe, host=host, port=port), dict(env or {}), f"http://{advertise}:{port}"
    )


def register(run_dir: str | Path, launch: ServerLaunch, *, host: str | None = None, instance: int = 0) -> None:
    """Announce healthy `launch` in the run directory (`rlvr.rendezvous`), the judge as the judge;
    `host`: the node's name (default this machine's); `instance`: which start of it this is."""
    spec = launch.spec
    if spec is None:
        register_judge(run_dir, launch.url)  # the worker exports it as RLVR_JUDGE_URL
        return
    host = host or socket.gethostname()
    register_server(
        run_dir,
        ServerAddress(
            index=spec.index, url=launch.url, engine=spec.engine, host=host, gpus=spec.gpus, instance=instance
        ),
    )


@dataclass
class ServerSupervisor:
    """The servers one launcher started: start, health, deaths, restarts, stop.

    `children`: the set they are started in, which `stop` takes down whole. `log`: a server's
    name -> its log file. `restarts`: rollout servers' budget (None: a dead one stays dead);
    `judge_restarts`: the judge's. `run_dir`/`host`: where a restarted rollout server is registered
    again. `health`: hung-server detection (None: off)."""

    children: Children
    log: Callable[[str], Path]
    restarts: Restarts | None = None
    judge_restarts: Restarts | None = None
    run_dir: Path | None = None
    host: str | None = None
    health: HealthWatch | None = None
    launches: dict[str, ServerLaunch] = field(default_factory=dict)
    current: dict[str, Child] = field(default_factory=dict)  # name -> its latest process
    instances: dict[str, int] = field(default_factory=dict)  # name -> starts so far - 1
    _reported: set[int] = field(default_factory=set)  # ids of dead processes `dead` returned
    _hung: set[int] = field(default_factory=set)  # ids of processes killed for not answering

    @classmethod
    def for_recipe(
        cls, recipe: Recipe, children: Children, *, log: Callable[[str], Path], run_dir: Path, host: str | None = None
    ) -> ServerSupervisor:
        """What a recipe asks of supervision, the same on every launcher: rollout servers restarted in
        "continue" mode only (in "fail" a death stops the run), the judge always, hung ones killed."""
        rollout = recipe.rollout
        continues = recipe.sync.on_engine_failure == "continue"
        return cls(
            children,
            log=log,
            restarts=Restarts(max_restarts=rollout.server_restarts) if continues else None,
            judge_restarts=Restarts(max_restarts=rollout.server_restarts),
            run_dir=run_dir,
            host=host,
            health=HealthWatch(deadline_s=rollout.health_deadline_s),
        )

    def start(self, launch: ServerLaunch) -> Child:
        self.launches[launch.name] = launch
        env = dict(launch.env)
        if self.run_dir is not None and launch.spec is not None:  # fenced from the run's newest trainer
            env[GENERATION_FILE_ENV] = str(RunDir(self.run_dir).generation_file)
        child = self.children.start(launch.name, launch.argv, env=env, log=self.log(launch.name))
        self.current[launch.name] = child
        self.instances.setdefault(launch.name, 0)
        if self.health is not None:
            self.health.watch(launch.name, launch.url)
        return child

    def rollout(self, name: str) -> bool:
        """`name` is a rollout server (not the judge)."""
        return self.launches[name].spec is not None

    def healthy(self, name: str) -> bool:
        """One probe of server `name`'s /health."""
        return is_healthy(self.launches[name].url)

    def wait_healthy(
        self,
        *,
        timeout_s: float,
        poll_s: float = 0.3,
        stop: Callable[[], bool] | None = None,
        on_healthy: Callable[[ServerLaunch], None] | None = None,
    ) -> bool:
        """Probe every started server until each is healthy (`on_healthy` as each turns so): True;
        False as soon as `stop()` says to give up. Raises LaunchError, with the root cause from its
        log, for a server that exits first or is still not healthy after `timeout_s`."""
        pending = list(self.launches.values())
        deadline = time.monotonic() + timeout_s
        while pending:
            if stop is not None and stop():
                return False
            for launch in list(pending):
                child = self.current[launch.name]
                if not child.running():
                    raise failure(child, f"exited with code {child.proc.returncode} before it was healthy")
                if self.healthy(launch.name):
                    pending.remove(launch)
                    if on_healthy is not None:
                        on_healthy(launch)
            if pending and time.monotonic() > deadline:
                late = pending[0]
                raise failure(self.current[late.name], f"was not healthy at {late.url} after {timeout_s:.0f}s")
            if pending:
                time.sleep(poll_s)
        return True

    def kill_hung(self) -> None:
        """SIGKILL each server `health` finds hung; `dead` then reports it, `why` says it hung."""
        if self.health is None:
            return
        for name in self.health.hung():
            child = self.current[name]
            self.health.forget(name)
            if child.running():
                self._hung.add(id(child))
                send_group(child.pid, signal.SIGKILL)

    def dead(self) -> list[Child]:
        """The supervised processes that died since the last call, each returned once."""
        out = [c for c in self.current.values() if id(c) not in self._reported and not c.running()]
        self._reported.update(id(c) for c in out)
        for child in out:
            if self.health is not None:
                self.health.forget(child.name)
        return out

    def why(self, child: Child) -> str:
        """How dead `child` ended, for its one line."""
        if id(child) in self._hung and self.health is not None:
            return f"stopped answering /health for {self.health.deadline_s:g} s (hung)"
        return f"died with code {child.proc.returncode}"

    def died(self, child: Child) -> str | None:
        """Schedule a restart of dead server `child`; what to tell the user, or None when it is not
        restarted (no restarts for its kind, or out of restarts)."""
        if not self.rollout(child.name):
            if self.judge_restarts is None:
                return None
            return self.judge_restarts.died(child.name, then="what it was judging is judged again")
        return self.restarts.died(child.name) if self.restarts is not None else None

    def restart(self, name: str) -> Child:
        """Start server `name` again with its argv, env and port: its URL stays valid. A rollout
        server is registered again first, one instance on: the trainer sees a new process there."""
        launch = self.launches[name]
        self.instances[name] = self.instances.get(name, 0) + 1
        if self.run_dir is not None and launch.spec is not None:
            register(self.run_dir, launch, host=self.host, instance=self.instances[name])
        return self.start(launch)

    def restart_due(self) -> list[Child]:
        """`restart` each server whose restart time has come."""
        due = [
            *(self.restarts.due() if self.restarts else []),
            *(self.judge_restarts.due() if self.judge_restarts else []),
        ]
        return [self.restart(name) for name in due]

    def up(self) -> int:
        """How many rollout servers (not the judge) run now."""
        return sum(1 for name, c in self.current.items() if self.rollout(name) and c.running())

    def stop(self, *, grace_s: float) -> None:
        """Every server at once: SIGTERM each process tree, SIGKILL what outlives `grace_s`."""
        self.children.kill_all(grace_s=grace_s)
