"""Fakes for the sync tests: engines that record every call, a parent client, a fake group."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn


class TinyLM(nn.Module):
    """Enough of a model: a tied embedding/head pair, a linear layer and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(8))


@dataclass
class Server:
    url: str
    alive: bool = True
    dead_since: float = 0.0


@dataclass
class ParentClient:
    """The loop's client, as the sync sees it: live servers and their alive flags."""

    urls: list[str]
    ranks_per_server: int = 1
    api_key: str | None = None
    servers: list[Server] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.servers = [Server(u) for u in self.urls]

    @property
    def live_servers(self) -> list[str]:
        return [s.url for s in self.servers if s.alive]


class FakeEngine:
    """A one-URL client that records (url, method, args) into a shared log; `behave[method]`
    makes a call raise ("raise"), never answer ("hang") or report success False ("refuse")."""

    def __init__(self, url: str, log: list[tuple[str, str, dict[str, Any]]], behave: dict[str, str]):
        self.url, self.log, self.behave = url, log, behave
        self.healthy = True
        self.session = False
        self.info: dict[str, Any] = {}

    async def _call(self, method: str, **fields: Any) -> Any:
        self.log.append((self.url, method, fields))
        how = self.behave.get(method)
        if how == "raise":
            raise RuntimeError(f"{self.url}{method}: boom")
        if how == "hang":
            await asyncio.sleep(3600)
        if how == "refuse":
            return {"success": False, "message": "refused"}
        return None

    async def pause(self, mode: str = "abort") -> Any:
        return await self._call("pause", mode=mode)

    async def flush_cache(self) -> Any:
        return await self._call("flush_cache")

    async def resume(self) -> Any:
        return await self._call("resume")

    async def begin_weight_update(self) -> Any:
        if self.session:  # as SGLang 0.5.23's SchedulerWeightUpdaterManager.begin_weight_update
            return {"success": False, "message": "a weight-update session is already open"}
        result = await self._call("begin_weight_update")
        self.session = result is None
        return result

    async def end_weight_update(self) -> Any:
        self.session = False
        return await self._call("end_weight_update")

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> Any:
        return await self._call("destroy_weights_update_group", group_name=group_name)

    async def server_info(self) -> Any:
        await self._call("server_info")
        return dict(self.info)

    async def init_weights_update_group(self, **kw: Any) -> Any:
        return await self._call("init_weights_update_group", **kw)

    async def update_weights_from_distributed(self, names, dtypes, shapes, **kw: Any) -> Any:
        if not self.session:  # SGLang 0.5.23 refuses a bucket outside a session
            return {"success": False, "message": "must run between begin_weight_update() and end_weight_update()"}
        return await self._call("update_weights_from_distributed", names=names, dtypes=dtypes, shapes=shapes, **kw)

    async def update_weights_from_disk(self, path: str, *, version: int | None = None) -> Any:
        return await self._call("update_weights_from_disk", path=path, version=version)

    async def load_lora_adapter(self, path: str, *, version: int | None = None) -> Any:
        return await self._call("load_lora_adapter", path=path, version=version)

    async def health(self) -> bool:
        return self.healthy and self.behave.get("health") != "raise"

    async def close(self) -> None:
        pass


class FakeWork:
    def __init__(self, error: BaseException | None = None):
        self.error = error

    def wait(self, timeout: Any = None) -> bool:
        if self.error is not None:
            raise self.error
        return True


class FakeGroup:
    """Records what rank 0 broadcasts; `fail_at` makes the n-th broadcast's work fail."""

    def __init__(self, sent: list[torch.Tensor], fail_at: int | None = None, kw: dict | None = None):
        self.sent, self.fail_at, self.kw = sent, fail_at, kw or {}
        self.aborted = False

    def broadcast(self, tensors: list[torch.Tensor], options: Any) -> FakeWork:
        self.sent.append(tensors[0].clone())
        if self.fail_at is not None and len(self.sent) == self.fail_at:
            return FakeWork(RuntimeError("Connection closed by peer"))
        return FakeWork()

    def abort(self) -> None:
        self.aborted = True


@dataclass
class Harness:
    log: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    behave: dict[str, dict[str, str]] = field(default_factory=dict)
    engines: dict[str, FakeEngine] = field(default_factory=dict)
    sent: list[torch.Tensor] = field(default_factory=list)
    groups: list[FakeGroup] = field(default_factory=list)
    fail_broadcast_at: int | None = None

    def factory(self, url: str) -> FakeEngine:
        engine = FakeEngine(url, self.log, self.behave.setdefault(url, {}))
        self.engines[url] = engine
        return engine

    def join(self, **kw: Any) -> FakeGroup:
        group = FakeGroup(self.sent, self.fail_broadcast_at, kw)
        self.fail_broadcast_at = None  # only the first group breaks
        self.groups.append(group)
        return group

    def calls(self, url: str | None = None, *, all_calls: bool = False) -> list[str]:
        """The methods called on `url` (server_info and destroy omitted unless `all_calls`)."""
        quiet = () if all_calls else ("server_info", "destroy_weights_update_group")
        return [m for u, m, _ in self.log if (url is None or u == url) and m not in quiet]


@pytest.fixture
def harness() -> Harness:
    return Harness()


@pytest.fixture
def model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()
