"""Per-node entry inside a SLURM allocation: `python -m rlvr.launch.node --run-dir RUN`.

One task runs on every node (submitit's `rlvr.launch.slurm.run_node_task`, or `srun` in a
hand-written sbatch script). It reads the resolved recipe from the run directory, computes the same
LaunchPlan as the login node, finds which node it is, and runs torchrun (trainer nodes) or its
rollout servers (registered in `RUN/servers/` once healthy, kept alive until this attempt's trainer
is done). Nodes coordinate through files in the run directory, not sockets: it is the one thing
every node shares, and a requeued job must trust nothing the previous attempt left, so each attempt
is tied to `RUN/slurm/attempt.json` and ends with its `trainer_exit.json`. Signals: USR1/USR2 make
the trainer checkpoint and (with `--self-requeue`) requeue the job; SIGTERM/SIGINT stop every child
and exit without returning to submitit. docs/cluster.md ("What each node does") has the details.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.launch.argv import prepare_servers, trainer_command
from rlvr.launch.failure import LaunchError, failure
from rlvr.launch.health import HeartbeatWatch
from rlvr.launch.restarts import Restarts
from rlvr.launch.supervisor import ServerLaunch, ServerSupervisor, judge_launch, register, rollout_launch
from rlvr.launch.trainer_supervisor import TrainerSupervisor
from rlvr.monitor.metrics import append_event, mark_stopped
from rlvr.process import Children
from rlvr.recipe.plan import LaunchPlan, ServerSpec
from rlvr.rendezvous import clear_servers
from rlvr.rundir import DONE_STATES, RunDir, read_json, read_status, write_json_atomic

JUDGE_PORT_OFFSET = 100  # the judge listens at the rollout base port + this on the first rollout node

MASTER_PORT_ENV = "RLVR_MASTER_PORT"  # force torchrun's rendezvous port
SERVER_BIND_ENV = "RLVR_SERVER_BIND"  # bind servers here (default: this node's address)
SERVER_TIMEOUT_ENV = "RLVR_SERVER_START_TIMEOUT_S"
STOP_GRACE_ENV = "RLVR_STOP_GRACE_S"

EXIT_SIGNALLED = 143  # 128 + SIGTERM: the task was stopped (scancel, preemption, requeue)

TRAINER, ROLLOUT = "trainer", "rollout"


# -- pure logic: which node am I, what do I run ------------------------------------------------


@dataclass(frozen=True)
class NodeRole:
    """What one node of the allocation does; computed from the plan and SLURM's env vars."""

    index: int  # position in the job's node list (the plan's node index)
    name: str  # SLURM node name (SLURMD_NODENAME)
    kind: str  # "trainer" or "rollout"
    node_rank: int  # torchrun --node-rank on trainer nodes; -1 on rollout nodes
    master_node: str  # node name of the first trainer node (torchrun's master)
    master_port: int
    servers: tuple[ServerSpec, ...] = field(default_factory=tuple)
    job_id: str = ""
    restart_count: int = 0

    @property
    def attempt(self) -> str:
        """Identifies one run of the job: a requeued job keeps its id, its restart count grows."""
        return f"{self.job_id}.{self.restart_count}"

    @property
    def is_first_trainer(self) -> bool:
        return self.kind == TRAINER and self.node_rank == 0


class NodeError(RuntimeError):
    """The allocation does not match the plan (wrong node count, unknown node)."""


def node_index(env: Mapping[str, str], hostnames: Sequence[str]) -> int:
    """This node's position in the job's node list.

    SLURMD_NODENAME is looked up in the list first: it is right for any step, and on the
    test cluster (several slurmd on one host) it is the only thing that tells nodes apart.
    SLURM_NODEID (relative to the step) is the fallback; outside SLURM we are node 0.
    """
    name = env.get("SLURMD_NODENAME")
    if name and name in hostnames:
        return list(hostnames).index(name)
    if env.get("SLURM_NODEID", "").isdigit():
        return int(env["SLURM_NODEID"])
    return 0


def master_port_for(plan: LaunchPlan, env: Mapping[str, str]) -> int:
    """torchrun's port: RLVR_MASTER_PORT, else the plan's port shifted by the job id.

    Jobs that share a node (no --exclusive) would all rendezvous on 29500 otherwise; the
    shift stays below 30000, where the rollout servers' ports start by default.
    """
    if env.get(MASTER_PORT_ENV, "").isdigit():
        return int(env[MASTER_PORT_ENV])
    job = env.get("SLURM_JOB_ID", "")
    return plan.master_port + (int(job) % 500 if job.isdigit() else 0)


def node_role(plan: LaunchPlan, *, env: Mapping[str, str], hostnames: Sequence[str]) -> NodeRole:
    """The role of the node this process runs on (pure: golden-tested with fake env vars)."""
    if len(hostnames) != plan.nodes:
        raise NodeError(
            f"the recipe plans {plan.nodes} nodes but this job has {len(hostnames)} ({','.join(hostnames)}); "
            "set cluster.nodes to the allocation size"
        )
    index = node_index(env, hostnames)
    if not 0 <= index < plan.nodes:
        raise NodeError(f"node index {index} is outside the plan's {plan.nodes} nodes")
    common: dict[str, Any] = {
        "index": index,
        "name": env.get("SLURMD_NODENAME") or hostnames[index],
        "master_node": hostnames[plan.trainer_nodes[0]],
        "master_port": master_port_for(plan, env),
        "job_id": env.get("SLURM_JOB_ID", ""),
        "restart_count": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
    }
    if index in plan.trainer_nodes:
        return NodeRole(kind=TRAINER, node_rank=plan.trainer_nodes.index(index), **common)
    servers = tuple(s for s in plan.servers if s.node == index)
    return NodeRole(kind=ROLLOUT, node_rank=-1, servers=servers, **common)


# -- SLURM queries ------------------------------------------------------------------------------


def job_hostnames(env: Mapping[str, str]) -> list[str]:
    """The job's node names in allocation order (`scontrol show hostnames $SLURM_JOB_NODELIST`)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return [env.get("SLURMD_NODENAME") or socket.gethostname()]
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        names = out.split()
        if names:
            return names
    except (OSError, subprocess.SubprocessError):
        pass
    if "[" in nodelist:
        raise NodeError(f"cannot expand SLURM_JOB_NODELIST={nodelist} without scontrol")
    return nodelist.split(",")


def resolve_address(node: str) -> str:
    """An address other nodes can reach `node` at: its NodeAddr in SLURM, resolved to an IP.

    Node names need not be DNS names (the test cluster's node1/node2 are not); NodeAddr is
    what slurmd itself is reached at, so it is the address to trust.
    """
    addr = node
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "--oneliner", node], capture_output=True, text=True, timeout=30
        ).stdout
        for token in out.split():
            if token.startswith("NodeAddr="):
                addr = token.split("=", 1)[1] or node
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return socket.gethostbyname(addr)
    except OSError:
        return addr


# -- the node process ---------------------------------------------------------------------------


def _log(role: NodeRole | None, message: str) -> None:
    where = f"{role.name} {role.kind}" if role else socket.gethostname()
    print(f"[rlvr.node {where}] {message}", file=sys.stderr, flush=True)


class Node:
    """One node's lifetime: start children, forward signals, clean up on every exit path."""

    def __init__(self, run_dir: Path, *, recipe_path: Path | None = None, self_requeue: bool = False):
        from rlvr.recipe.load import recipe_from_json
        from rlvr.recipe.plan import make_plan

        self.run_dir = run_dir
        self.paths = RunDir(run_dir)
        self.recipe = recipe_from_json((recipe_path or self.paths.recipe).read_text())
        plan = make_plan(self.recipe)
        env = os.environ
        self.role = node_role(plan, env=env, hostnames=job_hostnames(env))
        self.plan = make_plan(self.recipe, master_port=self.role.master_port)
        self.self_requeue = self_requeue
        # SIGUSR1/2 ignored: SLURM signals every process of a step, and torchrun (and a server
        # without a handler) would die of the time-limit warning instead of letting the worker
        # checkpoint; rlvr.worker installs its own handler and still gets it.
        self.children = Children(death_signal=signal.SIGKILL, ignore=(signal.SIGUSR1, signal.SIGUSR2))
        self.servers = ServerSupervisor.for_recipe(
            self.recipe, self.children, log=self.paths.log, run_dir=run_dir, host=self.role.name
        )
        self.signals: list[int] = []
        self.grace_s = float(os.environ.get(STOP_GRACE_ENV, "20"))
        self._generations = 0  # trainer starts on this node so far

    # signals are only recorded here; the main loop acts on them (no work inside a handler)
    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)

    def install_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, self._on_signal)

    def run(self) -> int:
        self.install_handlers()
        _log(self.role, f"node {self.role.index}/{self.plan.nodes} attempt {self.role.attempt}")
        try:
            return self.run_trainer() if self.role.kind == TRAINER else self.run_rollout()
        except BaseException:
            if self.role.is_first_trainer:  # rollout nodes must not wait for a trainer that is gone
                self._write_trainer_exit(1)
            raise
        finally:
            self.children.kill_all(grace_s=self.grace_s)

    # -- stopping

    def _stop(self) -> None:
        """SIGTERM: let the workers save, kill the rest, record `stopped`, leave without a result."""
        _log(self.role, "SIGTERM: stopping children")
        self.children.signal_workers(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while self.children.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.children.kill_all(grace_s=0.5)  # SLURM's SIGKILL follows SIGTERM after KillWait
        if self.role.is_first_trainer:
            mark_stopped(self.run_dir)
            self._write_trainer_exit(EXIT_SIGNALLED)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_SIGNALLED)

    def _pending(self) -> list[int]:
        out, self.signals = self.signals, []
        return out

    # -- trainer nodes

    def run_trainer(self) -> int:
        role = self.role
        trainer = self._trainer_supervisor()
        _log(role, " ".join(trainer.command("auto")))
        trainer.start()
        preempted = False
        while True:
            done = trainer.poll()
            for sig in self._pending():  # drained once more after the exit: a signal may race it
                if sig in (signal.SIGTERM, signal.SIGINT):
                    self._stop()
                _log(role, f"{signal.Signals(sig).name}: asking the trainer to checkpoint and exit")
                preempted = True
                trainer.ask_stop(sig)
            if done is not None:
                break
            time.sleep(0.1)
        rc = done.code
        _log(role, f"trainer exited with {rc}")
        if role.is_first_trainer:
            self._write_trainer_exit(rc)
        if preempted and self.self_requeue and role.is_first_trainer and not self._finished():
            self._requeue()
        return rc

    def _trainer_supervisor(self) -> TrainerSupervisor:
        """This node's trainer ranks, watched by their heartbeats. Only a one-trainer-node job restarts
        its trainer in place: several nodes would have to restart together, so there the job ends
        and a requeue resumes it."""
        role, per_node = self.role, self.plan.trainer_procs_per_node
        argv = trainer_command(
            self.plan, run_dir=self.run_dir, node_rank=role.node_rank, master_addr=resolve_address(role.master_node)
        )
        ranks = range(role.node_rank * per_node, (role.node_rank + 1) * per_node)
        alone = len(self.plan.trainer_nodes) == 1

        def say(message: str) -> None:
            _log(role, message)
            append_event(self.run_dir, message)

        return TrainerSupervisor(
            self.children,
            self.paths,
            command=lambda resume: argv,
            heartbeats=HeartbeatWatch(
                self.paths.heartbeats, deadline_s=self.recipe.rollout.health_deadline_s, ranks=ranks
            ),
            restarts=Restarts(max_restarts=self.recipe.experiment.trainer_restarts if alone else 0),
            say=say,
            env={"RLVR_NODE_ROLE": TRAINER, "RLVR_ATTEMPT": role.attempt},
            log_name=self._trainer_log,
            next_generation=self._generation,
        )

    def _generation(self) -> int:
        """The generation of the trainer this node starts next (`RunDir.next_generation`). The first
        trainer node counts each start and, for an attempt's first, clears the last attempt's
        servers and names the attempt (with its generation) in attempt.json; other trainer nodes
        (never restarted in place) take the attempt's generation from there."""
        role, first = self.role, self._generations == 0
        self._generations += 1
        if role.is_first_trainer:
            generation = self.paths.next_generation()
            if first:
                clear_servers(self.run_dir)
                record = {"attempt": role.attempt, "time": time.time(), "generation": generation}
                write_json_atomic(self.paths.attempt, record)
            return generation
        while True:
            data = read_json(self.paths.attempt)
            if data and data.get("attempt") == role.attempt and "generation" in data:
                return int(data["generation"])
            if any(sig in (signal.SIGTERM, signal.SIGINT) for sig in self.signals):
                self._stop()
            time.sleep(0.2)

    @property
    def _trainer_log(self) -> str:
        """logs/trainer.log, as on one machine; one per node when several run trainer ranks."""
        return "trainer" if len(self.plan.trainer_nodes) == 1 else f"trainer-node{self.role.node_rank}"

    def _finished(self) -> bool:
        return (read_status(self.run_dir) or {}).get("state") == "finished"

    def _write_trainer_exit(self, rc: int) -> None:
        write_json_atomic(self.paths.trainer_exit, {"attempt": self.role.attempt, "rc": rc, "time": time.time()})

    def _requeue(self) -> None:
        """Put the job back in the queue; SLURM then SIGTERMs this attempt (handled by _stop)."""
        _log(self.role, f"requeueing job {self.role.job_id}")
        try:
            subprocess.run(["scontrol", "requeue", self.role.job_id], check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            _log(self.role, f"scontrol requeue failed: {exc}")
            return
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(s in (signal.SIGTERM, signal.SIGINT) for s in self._pending()):
                self._stop()
            time.sleep(0.1)

    # -- rollout nodes

    def run_rollout(self) -> int:
        role = self.role
        prepare_servers(self.recipe)
        for spec in role.servers:  # forget this node's registrations from an earlier attempt
            self.paths.server(spec.index).unlink(missing_ok=True)
        for launch in self._launches():
            _log(role, f"{launch.name}: {' '.join(launch.argv)}")
            self.servers.start(launch)
        timeout = float(os.environ.get(SERVER_TIMEOUT_ENV, "1800"))
        try:
            up = self.servers.wait_healthy(timeout_s=timeout, poll_s=0.5, stop=self._trainer_gone, on_healthy=self._up)
        except LaunchError as exc:  # one exited, or was not healthy in time
            _log(role, str(exc))
            return 1
        attempt = self._wait_for_attempt() if up else None
        if attempt is None:
            return 0
        for launch in self.servers.launches.values():
            register(self.run_dir, launch, host=role.name)
        _log(role, f"registered servers {[s.index for s in role.servers]}; serving until the trainer is done")
        while not self._trainer_done(since=attempt.get("time")):
            self._rollout_signals()
            self._supervise()
            time.sleep(0.5)
        _log(role, "trainer done: stopping servers")
        return 0

    def _launches(self) -> list[ServerLaunch]:
        """This node's servers, bound to RLVR_SERVER_BIND or its address; the recipe's judge model
        beside the first rollout server (CPU-sized judges)."""
        address = resolve_address(self.role.name)
        host, env = os.environ.get(SERVER_BIND_ENV, address), {"RLVR_NODE_ROLE": ROLLOUT}
        launches = [
            rollout_launch(self.recipe, spec, host=host, advertise=address, colocate=self.plan.colocate, env=env)
            for spec in self.role.servers
        ]
        if self.recipe.judge is not None and any(spec.index == 0 for spec in self.role.servers):
            port = self.recipe.rollout.base_port + JUDGE_PORT_OFFSET
            launches.append(judge_launch(self.recipe, port=port, host=host, advertise=address, env=env))
        return launches

    def _up(self, launch: ServerLaunch) -> None:
        _log(self.role, f"{launch.name} healthy at {launch.url}")

    def _supervise(self) -> None:
        """Say each death once and restart what is due ("continue"); in "fail" mode the trainer's
        weight sync stops the run, naming the dead server."""
        self.servers.kill_hung()
        for child in self.servers.dead():
            plan = self.servers.died(child)
            _log(self.role, f"{failure(child, self.servers.why(child))}{f'; {plan}' if plan else ''}")
        for fresh in self.servers.restart_due():
            _log(self.role, f"{fresh.name} restarted (pid {fresh.pid})")

    def _rollout_signals(self) -> None:
        for sig in self._pending():
            if sig in (signal.SIGTERM, signal.SIGINT):
                self._stop()
            # USR1/USR2: nothing to save on a rollout node; the trainer decides about requeue

    def _wait_for_attempt(self) -> dict[str, Any] | None:
        """Register only once the first trainer node has cleared the previous attempt's files."""
        while True:
            if self._trainer_gone():
                return None
            data = read_json(self.paths.attempt)
            if data and data.get("attempt") == self.role.attempt:
                return data
            time.sleep(0.2)

    def _trainer_gone(self) -> bool:
        """Signals acted on, then: has this attempt's trainer exited (nothing left to serve)?"""
        self._rollout_signals()
        return self._trainer_done()

    def _trainer_done(self, *, since: float | None = None) -> bool:
        """The trainer node's exit marker for this attempt, or a final status of a run started since."""
        marker = read_json(self.paths.trainer_exit)
        if marker and marker.get("attempt") == self.role.attempt:
            return True
        if since is None:
            return False
        status = read_status(self.run_dir) or {}
        return status.get("state") in DONE_STATES and float(status.get("started_at", 0)) >= since


def run(run_dir: str | Path, *, recipe_path: str | Path | None = None, self_requeue: bool = False) -> int:
    """Run this node's part of the job; returns the trainer's exit code (0 on rollout nodes)."""
    node = Node(
        Path(run_dir).resolve(), recipe_path=Path(recipe_path) if recipe_path else None, self_requeue=self_requeue
    )
    return node.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlvr.launch.node", description="Per-node entry inside a SLURM allocation."
    )
    parser.add_argument("--run-dir", type=Path, help="The run directory (shared by every node).")
    parser.add_argument(
        "--recipe", type=Path, default=None, help="Resolved recipe JSON (default: RUN/resolved_recipe.json)."
    )
    parser.add_argument(
        "--self-requeue", action="store_true", help="On SIGUSR1/2, requeue the job after the trainer checkpointed."
    )
    args = parser.parse_args(argv)
    if args.run_dir is None:
        parser.error("--run-dir is required")
    return run(args.run_dir, recipe_path=args.recipe, self_requeue=args.self_requeue)


if __name__ == "__main__":
    sys.exit(main())
