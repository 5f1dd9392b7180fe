"""llm_judge keeps one HTTP session per judge URL and event loop: connections are reused across
verdicts (counted at the judge by client port), and the session closes with its loop."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from rlvr.rewards import llm_judge
from rlvr.rewards.llm_judge import score
from tests.conftest import serve_app

from .conftest import make_completion, make_sample


async def start_judge() -> tuple[web.AppRunner, str, list[Any]]:
    """A judge answering YES that records each request's client address."""
    peers: list[Any] = []

    async def chat(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        await asyncio.sleep(0.01)
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "YES"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner, url = await serve_app(app)
    return runner, url, peers


async def verdicts(url: str, count: int) -> list[float]:
    sample = make_sample(ground_truth="1")
    results = await asyncio.gather(
        *(score(sample, make_completion("1"), judge_url=url, max_concurrency=2) for _ in range(count))
    )
    return [r.score for r in results]


async def test_many_verdicts_share_one_session_and_its_connections() -> None:
    runner, url, peers = await start_judge()
    try:
        assert await verdicts(url, 20) == [1.0] * 20
        session = llm_judge._sessions[asyncio.get_running_loop()][url]
        assert await verdicts(url, 10) == [1.0] * 10
        assert llm_judge._sessions[asyncio.get_running_loop()][url] is session  # the same one, kept
        # 30 calls, at most 2 at a time (max_concurrency): kept-alive connections, not one per call
        assert len(peers) == 30 and len(set(peers)) <= 2
        await llm_judge.aclose_sessions()
        assert session.closed and asyncio.get_running_loop() not in llm_judge._sessions
    finally:
        await runner.cleanup()


def test_sessions_close_with_an_asyncio_run_loop() -> None:
    async def main() -> Any:
        runner, url, _ = await start_judge()
        try:
            assert await verdicts(url, 3) == [1.0] * 3
            return llm_judge._sessions[asyncio.get_running_loop()][url]
        finally:
            await runner.cleanup()

    session = asyncio.run(main())
    assert session.closed  # asyncio.run shut the loop's async generators down: the holder closed it


def test_close_sessions_closes_a_stopped_hand_run_loop_s_sessions() -> None:
    """The rollout manager's case: its own loop, stopped (not closed) when the pool closes."""
    loop = asyncio.new_event_loop()
    try:
        runner, url, _ = loop.run_until_complete(start_judge())
        assert loop.run_until_complete(verdicts(url, 3)) == [1.0] * 3
        session = llm_judge._sessions[loop][url]
        llm_judge.close_sessions()
        assert session.closed and loop not in llm_judge._sessions
        llm_judge.close_sessions()  # twice is fine
        loop.run_until_complete(runner.cleanup())
    finally:
        loop.close()


def test_the_reward_pool_closes_the_judges_sessions_when_it_closes() -> None:
    """RolloutManager.close -> RewardPool.close: the run's judge sessions do not outlive it."""
    from rlvr.rewards.pool import RewardPool

    loop = asyncio.new_event_loop()
    try:
        runner, url, _ = loop.run_until_complete(start_judge())
        assert loop.run_until_complete(verdicts(url, 2)) == [1.0] * 2
        session = llm_judge._sessions[loop][url]
        RewardPool.from_domains({}, max_workers=0).close()
        assert session.closed
        loop.run_until_complete(runner.cleanup())
    finally:
        loop.close()
