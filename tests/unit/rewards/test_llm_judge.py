from __future__ import annotations

import asyncio
import re

import pytest
from aiohttp import web

from rlvr.process import free_port
from rlvr.rewards import llm_judge
from rlvr.rewards.llm_judge import parse_rubric, parse_yes_no, score
from rlvr.rewards.pool import RewardPool
from rlvr.types import Group
from tests.conftest import serve_app

from .conftest import make_completion, make_sample


@pytest.mark.parametrize(
    ("text", "expected"),
    [("YES", 1.0), ("no", 0.0), ("At first I thought yes... final: NO", 0.0), ("**YES**", 1.0), ("maybe", None)],
)
def test_parse_yes_no(text, expected):
    assert parse_yes_no(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("Score: 7", 0.7), ("I'd give it 8/10.", 0.8), ("**Score:** **9**", 0.9), ("Final score = 10", 1.0),
     ("**6**", 0.6), ("5", 0.5), ("Score: 42", None), ("no idea", None)],
)  # fmt: skip
def test_parse_rubric(text, expected):
    result = parse_rubric(text)
    assert result == (pytest.approx(expected) if expected is not None else None)


class Judge:
    """A tiny OpenAI-compatible server; `script` lists per-request behaviours."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[str] = []
        self.reply = "YES"

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"body": body, "auth": request.headers.get("Authorization")})
        action = self.script.pop(0) if self.script else "ok"
        if action in ("500", "503", "400", "401"):
            return web.Response(status=int(action), text="refused")
        if action == "slow":
            await asyncio.sleep(1.5)
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": self.reply}}]})


@pytest.fixture
async def judge():
    server = Judge()
    app = web.Application()

    async def route(request):  # late-bound: tests swap server.handle
        return await server.handle(request)

    app.router.add_post("/v1/chat/completions", route)
    runner, server.url = await serve_app(app)  # type: ignore[attr-defined]
    yield server
    await runner.cleanup()


async def test_reference_yes_and_no(judge, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    sample = make_sample(ground_truth="Paris", messages=[{"role": "user", "content": "Capital of France?"}])
    result = await score(
        sample,
        make_completion("<think>hmm</think>It is Paris."),
        judge_url=judge.url,
        model="m",
        api_key_env="JUDGE_KEY",
    )
    assert result.score == 1.0
    sent = judge.requests[-1]
    assert sent["auth"] == "Bearer sk-test" and sent["body"]["model"] == "m"
    prompt = sent["body"]["messages"][0]["content"]
    assert "Paris" in prompt and "Capital of France?" in prompt and "hmm" not in prompt
    judge.reply = "The response says Lyon. NO"
    assert (await score(sample, make_completion("Lyon"), judge_url=judge.url)).score == 0.0


async def test_rubric_and_url_from_env(judge, monkeypatch):
    monkeypatch.setenv("RLVR_JUDGE_URL", judge.url)
    judge.reply = "Decent answer.\nScore: 7"
    result = await score(make_sample(), make_completion("an essay"))
    assert result.score == pytest.approx(0.7) and result.info["reason"] == "judge: rubric"


async def test_retry_500_then_success(judge):
    judge.script = ["500", "500"]
    before = llm_judge.JUDGE_METRICS["retries"]
    result = await score(make_sample(ground_truth="1"), make_completion("1"), judge_url=judge.url, backoff_s=0.01)
    assert result.score == 1.0 and len(judge.requests) == 3
    assert llm_judge.JUDGE_METRICS["retries"] - before == 2


async def test_gives_up_after_retries(judge):
    judge.script = ["500"] * 5
    result = await score(
        make_sample(ground_truth="1"), make_completion("1"), judge_url=judge.url, max_retries=1, backoff_s=0.01
    )
    assert result.failed == f"judge {judge.url} failed after 2 attempts: HTTP 500" and len(judge.requests) == 2


async def test_timeout_is_failed_and_counted(judge):
    judge.script = ["slow"]
    before = llm_judge.JUDGE_METRICS["timeouts"]
    result = await score(make_sample(ground_truth="1"), make_completion("1"), judge_url=judge.url, timeout_s=0.3)
    assert result.failed == f"judge {judge.url} gave no answer within 0.3 s" and result.info["timeout"]
    assert llm_judge.JUDGE_METRICS["timeouts"] == before + 1


async def test_content_refusal_is_the_responses_zero_but_credentials_are_failed(judge):
    """A 400 can be the response's doing (too long for the judge's context): a 0, never "failed",
    or a policy could write its way out of training. A 401 is the recipe's: failed."""
    judge.script = ["400"]
    refused = await score(make_sample(ground_truth="1"), make_completion("1" * 5000), judge_url=judge.url)
    assert refused.judged and refused.score == 0.0 and refused.info["reason"].startswith("judge refused the request")
    judge.script = ["401"]
    denied = await score(make_sample(ground_truth="1"), make_completion("1"), judge_url=judge.url)
    assert denied.failed is not None and "HTTP 401" in denied.failed


async def test_unparsable_and_unreachable(judge):
    judge.reply = "I cannot decide."
    result = await score(make_sample(ground_truth="1"), make_completion("1"), judge_url=judge.url)
    assert result.judged and result.score == 0.0 and result.info["reason"] == "unparsable judge answer"
    closed = await score(
        make_sample(ground_truth="1"),
        make_completion("1"),
        judge_url="http://127.0.0.1:9",
        max_retries=1,
        backoff_s=0.01,
        down_wait_s=0,  # no wait for a judge that is down: a connection error is one more retry
    )
    assert closed.failed is not None and closed.failed.startswith("judge http://127.0.0.1:9 failed after 2 attempts: ")


async def test_concurrency_limit_per_url(judge):
    in_flight = {"now": 0, "max": 0}
    original = judge.handle

    async def counting(request):
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await asyncio.sleep(0.05)
        try:
            return await original(request)
        finally:
            in_flight["now"] -= 1

    judge.handle = counting
    sample = make_sample(ground_truth="1")
    await asyncio.gather(
        *(score(sample, make_completion("1"), judge_url=judge.url, max_concurrency=2) for _ in range(6))
    )
    assert len(judge.requests) == 6 and in_flight["max"] == 2


class RestartableJudge:
    """A judge that answers YES on a fixed port, and can die (connections refused) and come back
    on the same port, as the launcher restarts a dead judge."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def chat(request: web.Request) -> web.Response:
            return web.json_response({"choices": [{"message": {"role": "assistant", "content": "YES"}}]})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


async def test_samples_a_dying_judge_was_judging_are_judged_again_when_it_is_back():
    """Down for 1.5 s (a real restart takes 10-60 s): the sample gets the judge's real verdict, the
    waits are counted, and they are off the pool's deadline (1 s here), as a queue for a slot is."""
    judge = RestartableJudge()
    await judge.start()
    args = {"judge_url": judge.url, "backoff_s": 0.1, "max_retries": 0}
    pool = RewardPool.from_domains({"qa": ("llm_judge", args)}, call_timeout_s=1.0)
    warm = Group(make_sample(domain="qa", ground_truth="1"), [make_completion("1")])
    await pool.score_groups([warm])  # leaves a kept-alive connection to the server that dies
    await judge.stop()
    before = llm_judge.JUDGE_METRICS["down_retries"]

    async def restart_later() -> None:
        await asyncio.sleep(1.5)
        await judge.start()

    restart = asyncio.ensure_future(restart_later())
    group = Group(make_sample(domain="qa", ground_truth="1"), [make_completion("1")])
    try:
        metrics = await pool.score_groups([group])
    finally:
        await restart
        await judge.stop()
    assert [r.failed for r in group.rewards] == [None] and group.scores == [1.0]
    assert llm_judge.JUDGE_METRICS["down_retries"] - before >= 3  # 0.1 + 0.2 + 0.4 s < 1.5 s
    assert metrics["reward/judge/down_retries_total"] == llm_judge.JUDGE_METRICS["down_retries"]


async def test_a_judge_that_stays_down_is_failed_after_down_wait_s_and_then_at_once():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: connections are refused
    sample, completion = make_sample(ground_truth="1"), make_completion("1")
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await score(sample, completion, judge_url=url, down_wait_s=0.5, backoff_s=0.1)
    waited = loop.time() - start
    assert result.failed is not None and result.info["error"] and 0.5 <= waited < 2.0
    line = rf"judge {re.escape(url)} was down for 0\.[5-9] s \(down_wait_s = 0\.5\): ClientConnectorError: .+"
    assert re.fullmatch(line, result.failed), result.failed
    # known down past its wait: the next call is failed at once, not after a wait of its own
    start = loop.time()
    again = await score(sample, completion, judge_url=url, down_wait_s=0.5, backoff_s=0.1)
    assert again.failed is not None and again.failed.startswith(f"judge {url} was down for ")
    assert loop.time() - start < 0.4


async def test_503_is_a_judge_that_is_down_not_an_answer_to_retry(judge):
    """A proxy answers 503 while the judge behind it restarts: waited for, not counted in max_retries."""
    judge.script = ["503", "503"]
    before = llm_judge.JUDGE_METRICS["down_retries"]
    result = await score(
        make_sample(ground_truth="1"), make_completion("1"), judge_url=judge.url, max_retries=0, backoff_s=0.01
    )
    assert result.score == 1.0 and len(judge.requests) == 3
    assert llm_judge.JUDGE_METRICS["down_retries"] - before == 2
