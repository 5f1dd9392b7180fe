"""The broadcast update group as rank 0 keeps it: which rollout engines are in it, joining them, tearing it down.

A group is {trainer rank 0 (hosts the TCPStore), every engine rank}; each engine's ranks start
at its `rank_offset`, and each takes as many ranks as its tensor parallelism (`/server_info`).
Joining is a handshake: every engine is asked to join (`init_weights_update_group`) while rank 0
joins on a thread of its own, and an engine that answers with a failure ends the wait early.
Each group gets a name never used before, since engines refuse a name they once joined.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol, TypedDict, cast
from urllib.parse import urlparse

from rlvr.process import free_port
from rlvr.sync.base import EngineFailure, SyncError
from rlvr.sync.buckets import engine_dtype
from rlvr.sync.engine_calls import EngineCalls, Futures
from rlvr.sync.group import WeightGroup, join_group

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch import Tensor, nn

log = logging.getLogger(__name__)

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
JOIN_STAGE = "init_weights_update_group"


class Work(Protocol):
    """An asynchronous broadcast in flight."""

    def wait(self, timeout: timedelta, /) -> object: ...


class BroadcastGroup(Protocol):
    """Rank 0's member of the update group (a `WeightGroup`; tests pass fakes)."""

    def broadcast(self, tensors: list[Tensor], options: dist.BroadcastOptions, /) -> Work: ...


class JoinGroup(Protocol):
    """How rank 0 joins a group (`join_group`; a seam for tests)."""

    def __call__(
        self,
        *,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float,
    ) -> BroadcastGroup: ...


class ServerInfo(TypedDict, total=False):
    """The fields of an engine's `/server_info` the group reads."""

    tp_size: int | None
    dp_size: int | None
    dtype: object


@dataclass(frozen=True, slots=True)
class Layout:
    """Each engine's rank count, the engines' weight dtype (None: unknown), and who failed to say."""

    ranks: dict[str, int]
    dtype: str | None
    failures: list[EngineFailure]


def reachable_address(urls: list[str]) -> str:
    """The address engines can reach this process at: loopback if they are all local, else
    the interface the OS routes to the first remote engine through (no packet is sent).
    `RLVR_SYNC_MASTER_ADDR` overrides."""
    if os.environ.get("RLVR_SYNC_MASTER_ADDR"):
        return os.environ["RLVR_SYNC_MASTER_ADDR"]
    remote = [u for u in urls if (urlparse(u).hostname or "127.0.0.1") not in LOOPBACK]
    if not remote:
        return "127.0.0.1"
    parsed = urlparse(remote[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((parsed.hostname, parsed.port or 80))
        return str(sock.getsockname()[0])


def abort(group: BroadcastGroup) -> None:
    """Close rank 0's end of a group so engines blocked in a broadcast fail now, not at their timeout."""
    if isinstance(group, WeightGroup):
        group.shutdown()
        return
    for method in ("abort", "shutdown"):  # a test's fake group has one of them
        fn = getattr(group, method, None)
        if fn is not None:
            try:
                fn()
                return
            except Exception:  # noqa: BLE001, S112 - try the next way; the group is being dropped anyway
                continue


def engine_layout(calls: EngineCalls, members: list[str], model: nn.Module) -> Layout:
    """Each engine's rank count (its tp_size) and the engines' weight dtype, from /server_info.

    An engine without the route (or a fake without the method) counts as the client's
    `ranks_per_server` ranks. dp_size > 1 is refused: SGLang's distributed update routes
    assert dp_size == 1.
    """
    answers = calls.results(members, "server_info")
    ranks: dict[str, int] = {}
    dtypes: set[str] = set()
    failures: list[EngineFailure] = []
    for url in members:
        answer = answers.get(url)
        info = cast(ServerInfo, answer) if isinstance(answer, dict) else ServerInfo()  # JSON from HTTP
        dp = int(info.get("dp_size") or 1)
        if dp > 1:
            why = f"dp_size = {dp}: SGLang's distributed weight update needs dp_size == 1 (use sync.method = disk)"
            failures.append(EngineFailure(url, "server_info", why))
            continue
        ranks[url] = int(info.get("tp_size") or calls.ranks_per_server)
        dtype = info.get("dtype")
        if isinstance(dtype, str):
            dtypes.add(engine_dtype(dtype, model))
    dtypes.discard("")
    if len(dtypes) > 1:
        raise SyncError(f"rollout engines serve different dtypes {sorted(dtypes)}; one wire dtype is needed")
    return Layout(ranks, dtypes.pop() if dtypes else None, failures)


class GroupMembership:
    """The update group rank 0 hosts and the engines in it (see the module docstring)."""

    def __init__(
        self,
        calls: EngineCalls,
        *,
        group_name: str,
        backend: str,
        timeout_s: float,
        master_address: str | None,
        join: JoinGroup | None,
    ) -> None:
        self.calls = calls
        self.group_name = group_name
        self.backend = backend
        self.timeout_s = timeout_s
        self.master_address = master_address
        self.join_fn: JoinGroup = join or join_group
        self.group: BroadcastGroup | None = None
        self.label = ""
        self.members: list[str] = []
        self.instances: dict[str, int | None] = {}  # each member's instance when it joined
        self._stale: tuple[list[str], str] = ([], "")  # the last group's engines and name, to destroy
        self._generation = 0
        self._instance = secrets.token_hex(4)

    def serves(self, members: list[str], calls: EngineCalls | None = None) -> bool:
        """Whether the current group is exactly `members`, each the same process that joined it
        (`calls.instance`): a server restarted on its URL has no member of the group."""
        if self.group is None or members != self.members:
            return False
        return calls is None or all(calls.instance(u) == self.instances.get(u) for u in members)

    def drop(self) -> None:
        """Tear the group down on rank 0's side; the engines keep their member until `free_stale`."""
        if self.group is not None:
            abort(self.group)
            self._stale = (list(self.members), self.label)
        self.group, self.members = None, []

    def free_stale(self, members: list[str]) -> None:
        """Free the engines' member of the last group (SGLang keeps it otherwise), for those still in `members`."""
        old_members, old_label = [m for m in self._stale[0] if m in members], self._stale[1]
        self._stale = ([], "")
        if old_members and old_label:
            for failure in self.calls.call(
                old_members, "destroy_weights_update_group", "destroy_weights_update_group", old_label
            ):
                log.info("weight sync: destroying group %s: %s", old_label, failure)

    def join(self, members: list[str], ranks: dict[str, int]) -> list[EngineFailure]:
        """Build a fresh group of rank 0 and `members`; returns the engines that failed to join."""
        self._generation += 1
        # Unique per sync, not only per rebuild: an engine keeps every group name it ever joined
        # (torch's registry, in SGLang and vLLM alike) and refuses one again, so a trainer that
        # restarts against engines that stayed up (a resume, another run) must not reuse a name.
        label = f"{self.group_name}-{self._instance}-{self._generation}"
        address = self.master_address or reachable_address(members)
        port = free_port(address)
        world = 1 + sum(ranks.values())
        offsets: dict[str, int] = {}
        next_rank = 1
        for url in members:
            offsets[url], next_rank = next_rank, next_rank + ranks[url]
        futures = self.calls.submit(
            members,
            JOIN_STAGE,
            master_address=address,
            master_port=port,
            world_size=world,
            group_name=label,
            backend=self.backend,
            per_url=lambda url: {"rank_offset": offsets[url]},
        )
        host = _Host(
            self.join_fn,
            address=address,
            port=port,
            world=world,
            label=label,
            backend=self.backend,
            timeout_s=self.timeout_s,
        )
        host.thread.start()
        self._await(host, futures)
        where = f"{label} at {address}:{port}"
        if not host.thread.is_alive() and host.group is not None:
            failures = self.calls.collect(futures, JOIN_STAGE)
            if not failures:
                self.group, self.label, self.members = host.group, label, list(members)
                self.instances = {url: self.calls.instance(url) for url in members}
                log.info("weight sync group %s: %d engines, world %d, %s:%d", label, len(members), world, address, port)
                return []
            abort(host.group)
            return failures
        return self._join_failures(members, futures, host, where)

    def _await(self, host: _Host, futures: Futures) -> None:
        """Wait for rank 0's join, but stop early once an engine has answered with a failure:
        the others then wait for it in vain until the timeout."""
        deadline = time.monotonic() + self.timeout_s
        while host.thread.is_alive() and time.monotonic() < deadline:
            host.thread.join(timeout=0.05)
            done = {u: f for u, f in futures.items() if f.done()}
            if done and self.calls.collect(done, JOIN_STAGE, timeout_s=0):
                break

    def _join_failures(self, members: list[str], futures: Futures, host: _Host, where: str) -> list[EngineFailure]:
        """Who to blame for a join that did not complete: engines that refused, else those still silent."""
        done = {u: f for u, f in futures.items() if f.done()}
        failures = self.calls.collect(done, JOIN_STAGE, timeout_s=0)
        if failures:
            return failures
        if host.error is not None:
            why = f"group {where} failed: {host.error!r}"
        else:
            why = f"did not join group {where} within {self.timeout_s:g}s"
        return [EngineFailure(url, JOIN_STAGE, why) for url in futures if not futures[url].done()] or [
            EngineFailure(url, JOIN_STAGE, why) for url in members
        ]


class _Host:
    """Rank 0 joining the group on a daemon thread (the join blocks until every engine joined)."""

    def __init__(
        self, join: JoinGroup, *, address: str, port: int, world: int, label: str, backend: str, timeout_s: float
    ) -> None:
        self.join, self.address, self.port, self.world = join, address, port, world
        self.label, self.backend, self.timeout_s = label, backend, timeout_s
        self.group: BroadcastGroup | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="rlvr-sync-join", daemon=True)

    def _run(self) -> None:
        try:
            self.group = self.join(
                master_address=self.address,
                master_port=self.port,
                rank=0,
                world_size=self.world,
                group_name=self.label,
                backend=self.backend,
                timeout_s=self.timeout_s,
            )
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc
