"""A group on one server: `run_group` over the real `SGLangClient` and two fake SGLang servers.

The fakes speak SGLang's /generate (a batch of items, each with its `sampling_seed`) and record
every body, so the tests read off the wire which server saw which group, whether a group went
as one n-sample request, and where its continuations (partial rollout) went. Also: the bound
on samples in flight per server, counted at a fake server, and the client's defaults.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from rlvr.recipe.schema import RolloutConfig
from rlvr.rollout.base import GenerateRequest, SamplingParams
from rlvr.rollout.episode import run_episode, run_group
from rlvr.rollout.factory import SERVER_INFLIGHT, make_client, max_inflight_per_server
from rlvr.rollout.pool import _Slots
from rlvr.rollout.sglang import SGLangClient
from rlvr.types import Completion
from tests.conftest import serve_app

PROMPT_LEN = 5
CONTINUATION = 1_000_003  # run_episode's seed shift per request


def token(seed: int, i: int) -> int:
    return 3 + (seed * 7 + i) % 90


class FakeSGLang:
    """/generate: item k answers `tokens` ids derived from its seed (finish "length"); with
    `abort_first`, an item whose input is a bare prompt gets 2 ids and finish "abort" (a weight
    push). `delay` holds each request; `in_flight`/`peak` count samples being answered."""

    def __init__(self, *, abort_first: bool = False, delay: float = 0.0) -> None:
        self.abort_first, self.delay = abort_first, delay
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = self.peak = 0
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def start(self) -> FakeSGLang:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        self.runner, self.url = await serve_app(app)
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        batched = isinstance(body["input_ids"][0], list)
        inputs = body["input_ids"] if batched else [body["input_ids"]]
        params = body["sampling_params"] if batched else [body["sampling_params"]]
        items = [(ids, p, j) for ids, p in zip(inputs, params, strict=True) for j in range(p.get("n", 1))]
        self.in_flight += len(items)
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= len(items)
        outputs = []
        for ids, p, j in items:
            seed = p.get("sampling_seed", 0) + j
            bare = len(ids) == PROMPT_LEN
            count = 2 if self.abort_first and bare else p["max_new_tokens"]
            out = [token(seed, i) for i in range(count)]
            meta = {
                "finish_reason": {"type": "abort" if self.abort_first and bare else "length"},
                "output_token_logprobs": [[-0.5, t, None] for t in out],
                "weight_version": "0",
            }
            outputs.append({"text": "", "output_ids": out, "meta_info": meta})
        return web.json_response(outputs if batched or len(outputs) > 1 else outputs[0])


def prompts(count: int) -> list[list[int]]:
    return [[10 + g, 11, 12, 13, 14] for g in range(count)]


def group_of(body: dict[str, Any]) -> int:
    """Which group's prompt a body continues (every input of a body starts with its prompt)."""
    ids = body["input_ids"][0] if isinstance(body["input_ids"][0], list) else body["input_ids"]
    return ids[0] - 10


def seeds(body: dict[str, Any]) -> list[int]:
    params = body["sampling_params"]
    return [p["sampling_seed"] for p in (params if isinstance(params, list) else [params])]


async def open_gate() -> None:
    return None


async def groups_on(
    client: SGLangClient,
    count: int,
    *,
    n: int,
    max_new_tokens: int = 6,
    weights_ready: Callable[[], Awaitable[object]] | None = None,
) -> list[list[Completion]]:
    async def one(g: int, prompt: list[int]) -> list[Completion]:
        params = SamplingParams(max_new_tokens=max_new_tokens, seed=1000 * g)
        ready = weights_ready or open_gate
        return await run_group(client, prompt_ids=prompt, params=params, n=n, partial=True, weights_ready=ready)

    return list(await asyncio.gather(*(one(g, p) for g, p in enumerate(prompts(count)))))


async def groups_on_two_servers(groups: int, *, n: int, abort_first: bool = False) -> tuple[Any, Any, Any]:
    """`groups_on` through one client over two fake servers; (server a, server b, the groups)."""
    a, b = await FakeSGLang(abort_first=abort_first).start(), await FakeSGLang(abort_first=abort_first).start()
    try:
        async with SGLangClient([a.url, b.url], backoff_s=0.01) as client:
            return a, b, await groups_on(client, groups, n=n)
    finally:
        await a.stop()
        await b.stop()


async def test_single_turn_groups_go_whole_to_one_server_as_one_n_sample_request() -> None:
    a, b, results = await groups_on_two_servers(8, n=4)
    for server in (a, b):  # one body per group: its 4 samples, seeds seed + j
        assert all(len(body["input_ids"]) == 4 and isinstance(body["input_ids"][0], list) for body in server.bodies)
        assert all(seeds(body) == [1000 * group_of(body) + j for j in range(4)] for body in server.bodies)
    on_a, on_b = {group_of(x) for x in a.bodies}, {group_of(x) for x in b.bodies}
    assert len(a.bodies) + len(b.bodies) == 8 and not on_a & on_b
    assert (len(on_a), len(on_b)) == (4, 4)  # groups spread evenly: 8 groups, 2 servers
    for g, group in enumerate(results):  # sample j is what seed + j samples
        assert [c.token_ids for c in group] == [[token(1000 * g + j, i) for i in range(6)] for j in range(4)]
        assert all(c.finish_reason == "length" for c in group)


async def test_aborted_samples_continue_one_by_one_on_their_group_s_server() -> None:
    a, b, results = await groups_on_two_servers(6, n=3, abort_first=True)
    on_a, on_b = {group_of(x) for x in a.bodies}, {group_of(x) for x in b.bodies}
    assert not on_a & on_b and on_a | on_b == set(range(6)) and (len(on_a), len(on_b)) == (3, 3)
    for g, group in enumerate(results):
        bodies = [x for x in a.bodies + b.bodies if group_of(x) == g]
        first, *continued = bodies
        assert len(first["input_ids"]) == 3 and len(continued) == 3  # one n-sample request, then one per sample
        assert sorted(seeds(x)[0] for x in continued) == [1000 * g + j + CONTINUATION for j in range(3)]
        for j, c in enumerate(group):  # 2 aborted ids of seed + j, then the continuation's 4 (budget 6)
            assert c.token_ids == [token(1000 * g + j, i) for i in range(2)] + [
                token(1000 * g + j + CONTINUATION, i) for i in range(4)
            ]
            assert c.finish_reason == "length"


async def test_a_group_whose_server_dies_fails_over_whole_to_another() -> None:
    a, b = await FakeSGLang(abort_first=True).start(), await FakeSGLang(abort_first=True).start()
    gate, firsts = asyncio.Event(), [0]

    async def weights_ready() -> None:  # the first request of each group goes; continuations wait
        firsts[0] += 1
        if firsts[0] > 2:
            await gate.wait()

    try:
        async with SGLangClient([a.url, b.url], backoff_s=0.01, revive_after_s=3600) as client:
            task = asyncio.ensure_future(groups_on(client, 2, n=3, weights_ready=weights_ready))
            while len(a.bodies) + len(b.bodies) < 2:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # both n-sample requests answered (aborted)
            assert len(a.bodies) == len(b.bodies) == 1  # one group each
            await a.stop()
            gate.set()
            results = await task
            assert client.live_servers == [b.url] and set(client._affinity.values()) == {b.url}
    finally:
        await a.stop()
        await b.stop()
    assert len(a.bodies) == 1 and len(b.bodies) == 1 + 6  # every continuation of both groups on b
    assert all(c.finish_reason == "length" and len(c.token_ids) == 6 for group in results for c in group)


async def test_samples_in_flight_per_server_are_bounded_and_an_n_sample_request_counts_n() -> None:
    server = await FakeSGLang(delay=0.05).start()
    try:
        requests = [GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=1, seed=s), n=2) for s in range(10)]
        async with SGLangClient([server.url]) as free:  # the baseline: no bound, all 20 samples at once
            await free.generate(requests)
        unbounded = server.peak
        server.peak = 0
        async with SGLangClient([server.url], max_inflight_per_server=4) as client:
            out = await client.generate(requests)
            connector = client.generation_session().connector
            assert connector is not None and connector.limit_per_host == 4
    finally:
        await server.stop()
    assert unbounded == 20
    assert server.peak == 4 and len(out) == 20  # two 2-sample requests at a time, all answered


async def test_slots_are_fifo_and_a_cancelled_waiter_leaks_none() -> None:
    slots = _Slots(4)
    assert await slots.acquire(3) == 3
    order: list[str] = []

    async def take(name: str, count: int) -> None:
        got = await slots.acquire(count)
        order.append(name)
        slots.release(got)

    big = asyncio.ensure_future(take("big", 9))  # capped at 4: waits for the whole bound
    small = asyncio.ensure_future(take("small", 1))  # would fit now, but queues behind big (FIFO)
    doomed = asyncio.ensure_future(slots.acquire(2))
    await asyncio.sleep(0)
    assert order == [] and slots.used == 3
    doomed.cancel()
    slots.release(3)
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and slots.used == 0


async def test_tool_episodes_run_apart_but_on_one_server_key() -> None:
    seen: list[GenerateRequest] = []

    class Engine:
        async def generate(self, requests: list[GenerateRequest]) -> list[Completion]:
            seen.extend(requests)
            return [Completion(text="done", token_ids=[5], logprobs=[-1.0], finish_reason="stop")]

    class Tools:
        stop, max_turns, max_tokens = ["</call>"], 2, 16

        def decode(self, ids: Any) -> str:
            return "done"

        def encode(self, text: str) -> list[int]:
            return [5]

        async def respond(self, text: str) -> None:
            return None

        def ends_with_call(self, text: str) -> bool:
            return False

        def reset(self) -> None:
            pass

        def stats(self) -> dict[str, float]:
            return {}

    params = SamplingParams(max_new_tokens=8, seed=40)
    sessions = [Tools() for _ in "abc"]
    out = await run_group(Engine(), prompt_ids=[1, 2], params=params, n=3, partial=True, tools=sessions)  # type: ignore[arg-type]
    assert len(out) == 3 and [r.n for r in seen] == [1, 1, 1]
    assert sorted(r.params.seed for r in seen if r.params.seed is not None) == [40, 41, 42]
    assert len({r.affinity for r in seen}) == 1 and seen[0].affinity is not None


def test_in_flight_default_follows_the_engine_and_the_recipe_key_wins() -> None:
    assert max_inflight_per_server(RolloutConfig(engine="embedded", max_batch=48)) == 96
    assert max_inflight_per_server(RolloutConfig(engine="vllm")) == SERVER_INFLIGHT
    sglang = RolloutConfig.model_validate({"engine": "sglang", "sglang": {"dp_size": 2}})
    assert max_inflight_per_server(sglang) == 2 * SERVER_INFLIGHT
    assert max_inflight_per_server(RolloutConfig(max_inflight_per_server=7)) == 7
    client = make_client(RolloutConfig(max_batch=8), ["http://a:1", "http://b:1"])
    assert client.max_inflight_per_server == 16 and all(s.slots is not None for s in client.servers)
    with pytest.raises(ValueError, match="max_inflight_per_server"):
        RolloutConfig(max_inflight_per_server=0)


@pytest.mark.filterwarnings("ignore::UserWarning")
async def test_the_embedded_engine_samples_a_group_as_n_separate_episodes_would(model_dir) -> None:
    """One n-sample request (shared prefill, sample j seeded seed + j) against n episodes each
    asking alone: the same ids and logprobs, so routing groups changes no run's samples."""
    from rlvr.server.embedded import EmbeddedEngine

    engine = EmbeddedEngine(model_dir, max_batch=8, device="cpu")
    try:
        prompt = engine.tokenizer.encode("the quick brown fox")
        params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=123)
        grouped = await run_group(engine, prompt_ids=prompt, params=params, n=4, partial=True)
        alone = []
        for j in range(4):
            seeded = SamplingParams(temperature=1.0, max_new_tokens=8, seed=123 + j)
            alone.append(await run_episode(engine, prompt_ids=prompt, params=seeded, partial=True))
    finally:
        engine.close()
    assert [c.token_ids for c in grouped] == [c.token_ids for c in alone]
    assert len({tuple(c.token_ids) for c in grouped}) > 1  # the seeds differ, so do the samples
    for g, a in zip(grouped, alone, strict=True):
        assert g.logprobs == pytest.approx(a.logprobs, abs=1e-5)
