from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

from rlvr.rewards.pool import RewardPool
from rlvr.types import Group

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
    assert math.scores == [1.0, 0.0, 0.0] and length.scores == [0.5, 1.0] and bad.scores == [0.0]
    assert metrics["reward/math/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/math/accuracy"] == pytest.approx(1 / 3)
    assert metrics["reward/len/mean"] == pytest.approx(0.75) and metrics["reward/len/accuracy"] == 0.5
    assert metrics["reward/bad/errors"] == 1.0 and "plug-in bug" in bad.rewards[0].info["reason"]
    assert metrics["reward/math/count"] == 3.0
    assert 0 <= metrics["reward/math/latency_p50_s"] <= metrics["reward/math/latency_p95_s"]


async def test_overall_timeout(plugins):
    pool = RewardPool.from_domains({"slow": ("pool_plugins:slow", {})}, call_timeout_s=0.2)
    group = Group(make_sample(domain="slow"), [make_completion("a"), make_completion("b")])
    metrics = await asyncio.wait_for(pool.score_groups([group]), timeout=5)
    assert group.scores == [0.0, 0.0] and group.rewards[0].info["reason"] == "timeout"
    assert metrics["reward/slow/timeouts"] == 2.0


async def test_unknown_domain_and_reward():
    with pytest.raises(KeyError, match="known rewards"):
        RewardPool.from_domains({"d": ("nope", {})})
    pool = RewardPool.from_domains({"d": ("math_rule", {})})
    with pytest.raises(KeyError, match="pool knows"):
        await pool.score_groups([Group(make_sample(domain="other"), [make_completion("x")])])
