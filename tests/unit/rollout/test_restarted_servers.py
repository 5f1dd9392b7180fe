"""A dead or restarted rollout server under a weight sync that re-admits it (`hold_dead`): held,
never serving the weights it booted with, while the group waits (`wait_s`) instead of failing its
step; let back in by `admit` once a push gave it the current weights. Real HTTP: a fake SGLang
server stopped and started again on its port."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from rlvr.process import free_port
from rlvr.rollout.base import RolloutError
from rlvr.rollout.pool import IDENTITY_POLL_S
from rlvr.rollout.sglang import SGLangClient
from tests.unit.rollout.test_group_routing import FakeSGLang, groups_on


class PortedFake(FakeSGLang):
    """FakeSGLang on a fixed port, so it can come back where it was."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port

    async def start(self) -> PortedFake:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.url = f"http://127.0.0.1:{self.port}"
        return self


def client_for(url: str, *, wait_s: float, instances: dict[str, int] | None = None) -> SGLangClient:
    source = (lambda: dict(instances)) if instances is not None else None
    return SGLangClient([url], backoff_s=0.01, max_retries=1, hold_dead=True, wait_s=wait_s, instances=source)


async def test_a_group_whose_server_died_waits_for_it_to_come_back_and_be_admitted() -> None:
    port = free_port()
    server = await PortedFake(port).start()
    await server.stop()  # dead before the group is sent
    url = f"http://127.0.0.1:{port}"
    async with client_for(url, wait_s=30) as client:
        group = asyncio.ensure_future(groups_on(client, 1, n=2))
        while url not in client.held_servers:
            await asyncio.sleep(0.05)
        assert not await client.stranded()  # held, and nothing answers there yet
        server = await PortedFake(port).start()  # back on its port: booted weights, so still held
        try:
            assert await client.stranded()  # the loop's cue to push it the current weights
            await asyncio.sleep(1.5)
            assert not group.done() and server.bodies == []  # never served while held
            client.admit(url)  # the push gave it the current weights
            [[first, second]] = await asyncio.wait_for(group, 10)
            assert len(server.bodies) == 1 and first.token_ids and second.token_ids
        finally:
            await server.stop()


async def test_past_its_wait_a_group_fails_its_step_with_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing ever listens here
    async with client_for(url, wait_s=0.5) as client:
        with pytest.raises(RolloutError) as caught:
            await groups_on(client, 1, n=2)
    message = str(caught.value)  # one try: a dead server is held, then only waited for
    assert message.startswith("/generate failed on every server after 1 try and 0.5 s of waiting for a live server: ")
    assert "ClientConnectorError" in message


async def test_a_server_restarted_on_its_url_is_held_until_admitted() -> None:
    server = await PortedFake(free_port()).start()
    instances = {server.url: 0}
    try:
        async with client_for(server.url, wait_s=30, instances=instances) as client:
            await groups_on(client, 1, n=2)
            assert len(server.bodies) == 1 and client.held_servers == []
            instances[server.url] = 1  # the launcher registered a restart at this URL (before it starts)
            await asyncio.sleep(IDENTITY_POLL_S)  # a server takes longer than this to start
            group = asyncio.ensure_future(groups_on(client, 1, n=2))
            await asyncio.sleep(1.5)
            assert client.held_servers == [server.url] and len(server.bodies) == 1  # not sent to it
            assert client.instance_of(server.url) == 1
            client.admit(server.url)
            await asyncio.wait_for(group, 10)
            assert len(server.bodies) == 2
    finally:
        await server.stop()


async def test_without_hold_dead_a_server_that_answers_again_serves_again() -> None:
    """Eval and runs that stop on a dead server ("fail"): no sync admits servers, nothing is held."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with SGLangClient([url], backoff_s=0.01, max_retries=1, revive_after_s=0.0) as client:
        with pytest.raises(RolloutError, match=r"after 2 tries: "):
            await groups_on(client, 1, n=2)
        assert client.held_servers == []
        server = await PortedFake(port).start()
        try:
            await groups_on(client, 1, n=2)
            assert len(server.bodies) == 1
        finally:
            await server.stop()
