"""Rollout servers announce themselves in the run directory; the trainer waits for them there.

The run directory is the one thing every node of a job (and the login node) can see, so
it doubles as the rendezvous: a server that is healthy writes `servers/<index>.json`
(`url`, `engine`, `host`, `gpus`, `instance`) atomically, and trainer rank 0 waits until the
plan's count is there, with a timeout and an error that names the missing servers. A server
restarted on its URL is registered again, before it starts, with its `instance` one higher: that
is how the trainer tells a new process (base weights, no update group) from the one it knew. The local
launcher and the SLURM node script both use this, so the worker never needs to know how
its servers were started.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlvr.rundir import RunDir, write_atomic, write_json_atomic


@dataclass(frozen=True)
class ServerAddress:
    index: int
    url: str
    engine: str = "embedded"
    host: str = field(default_factory=socket.gethostname)
    gpus: list[int] = field(default_factory=list)
    instance: int = 0
    """Which start of the server at `url` this is: 0, then one more per restart."""


class ServerWaitError(TimeoutError):
    """Not every planned rollout server registered in time."""


def register_server(run_dir: str | Path, address: ServerAddress) -> Path:
    path = RunDir(run_dir).server(address.index)
    write_json_atomic(path, asdict(address))
    return path


def clear_servers(run_dir: str | Path) -> None:
    """Forget a previous attempt's addresses (a requeued job gets new nodes and ports)."""
    paths = RunDir(run_dir)
    for path in paths.servers.glob("*.json") if paths.servers.exists() else []:
        path.unlink(missing_ok=True)
    paths.judge.unlink(missing_ok=True)


def register_judge(run_dir: str | Path, url: str) -> None:
    """The judge server (recipe `[judge]`) announces itself beside the rollout servers."""
    write_atomic(RunDir(run_dir).judge, url)


def wait_for_judge(run_dir: str | Path, *, timeout_s: float, poll_s: float = 0.5) -> str:
    path = RunDir(run_dir).judge
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise ServerWaitError(f"the judge server did not register at {path} within {timeout_s:.0f}s")
        time.sleep(poll_s)
    return path.read_text().strip()


def read_servers(run_dir: str | Path) -> list[ServerAddress]:
    folder = RunDir(run_dir).servers
    out = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            out.append(ServerAddress(**json.loads(path.read_text())))
        except (json.JSONDecodeError, TypeError):
            continue
    return sorted(out, key=lambda a: a.index)


def server_instances(run_dir: str | Path) -> dict[str, int]:
    """url -> instance of every registered rollout server (see the module docstring)."""
    return {address.url.rstrip("/"): address.instance for address in read_servers(run_dir)}


def wait_for_servers(run_dir: str | Path, *, count: int, timeout_s: float, poll_s: float = 0.5) -> list[ServerAddress]:
    deadline = time.monotonic() + timeout_s
    while True:
        servers = read_servers(run_dir)
        if len(servers) >= count:
            return servers[:count]
        if time.monotonic() > deadline:
            have = {s.index for s in servers}
            missing = [i for i in range(count) if i not in have]
            raise ServerWaitError(
                f"rollout servers {missing} did not register in {RunDir(run_dir).servers} within {timeout_s:.0f}s; "
                "check their logs in the run directory"
            )
        time.sleep(poll_s)
