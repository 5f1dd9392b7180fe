from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

from rlvr.rewards.pool import RewardPool
from rlvr.types import Group
from tests.conftest import serve_app

from .conftest import make_completion, make_sample


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "pool_plugins.py").write_text(
        textwrap.dedent(
            """
            import asyncio

            def length(sample, completion):
                return min(len(completion.text) / 10, 1.0)

            async def slow(sample, completion):
                await asyncio.sleep(10)
                return 1.0

            def broken(sample, completion):
                raise RuntimeError("plug-in bug")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("pool_plugins", None)


async def test_scores_groups_in_place_with_per_domain_metrics(plugins):
    pool = RewardPool.from_domains(
        {"math": ("math_rule", {}), "len": ("pool_plugins:length", {}), "bad": ("pool_plugins:broken", {})},
        max_workers=2,
        threshold=1.0,
    )
    math = Group(
        make_sample(domain="math", ground_truth="1/2"),
        [make_completion(t) for t in ("\\boxed{0.5}", "\\boxed{2}", "no")],
    )
    length = Group(make_sample(domain="len"), [make_completion("x" * 5), make_completion("x" * 20)])
    bad = Group(make_sample(domain="bad"), [make_completion("x")])
    try:
        metrics = await pool.score_groups([math, length, bad])
    finally:
        pool.close()
    assert math.scores == [1.0, 0.0, 0.0] and length.scores == [0.5, 1.0]
    assert all(r.judged for r in math.rewards + length.rewards)
    assert metrics["reward/math/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/math/accuracy"] == pytest.approx(1 / 3)
    assert metrics["reward/len/mean"] == pytest.approx(0.75) and metrics["reward/len/accuracy"] == 0.5
    assert bad.rewards[0].failed == "RuntimeError: plug-in bug"
    assert metrics["reward/bad/failed"] == 1.0 and metrics["reward/bad/count"] == 0.0
    assert "reward/bad/mean" not in metrics  # no judged sample: no mean to mislead
    assert metrics["reward/math/count"] == 3.0 and metrics["reward/math/failed"] == 0.0
    assert 0 <= metrics["reward/math/latency_p50_s"] <= metrics["reward/math/latency_p95_s"]


async def test_overall_timeout_is_failed(plugins):
    pool = RewardPool.from_domains({"slow": ("pool_plugins:slow", {})}, call_timeout_s=0.2)
    group = Group(make_sample(domain="slow"), [make_completion("a"), make_completion("b")])
    metrics = await asyncio.wait_for(pool.score_groups([group]), timeout=5)
    assert [r.failed for r in group.rewards] == ["no verdict within the pool's 0.2 s deadline"] * 2
    assert metrics["reward/slow/timeouts"] == 2.0 and metrics["reward/slow/failed"] == 2.0


async def test_deadline_counts_the_judges_time_not_the_queue_for_it():
    """Eight answers to a judge that takes 0.25 s each and serves one at a time: the last waits
    1.75 s for its turn. With a 0.6 s deadline on the call's own time every one is judged; the
    same deadline on the wall clock (the old behaviour) would fail most of them."""
    from aiohttp import web

    async def chat(request):
        await asyncio.sleep(0.25)
        return web.json_response({"choices": [{"message": {"content": "YES"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner, url = await serve_app(app)
    try:
        args = {"judge_url": url, "max_concurrency": 1, "max_retries": 0}
        pool = RewardPool.from_domains({"qa": ("llm_judge", args)}, call_timeout_s=0.6)
        group = Group(make_sample(domain="qa", ground_truth="4"), [make_completion("4") for _ in range(8)])
        start = asyncio.get_running_loop().time()
        metrics = await pool.score_groups([group])
        took = asyncio.get_running_loop().time() - start
    finally:
        await runner.cleanup()
    assert took > 1.9  # they really queued
    assert [r.failed for r in group.rewards] == [None] * 8 and group.scores == [1.0] * 8
    assert metrics["reward/qa/failed"] == 0.0


async def test_unknown_domain_and_reward():
    with pytest.raises(KeyError, match="known rewards"):
        RewardPool.from_domains({"d": ("nope", {})})
    pool = RewardPool.from_domains({"d": ("math_rule", {})})
    with pytest.raises(KeyError, match="pool knows"):
        await pool.score_groups([Group(make_sample(domain="other"), [make_completion("x")])])
