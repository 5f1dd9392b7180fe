"""`llm_judge`: score with an OpenAI-compatible chat model (POST {judge_url}/v1/chat/completions).

Two templates: `reference` (default when the sample has a ground_truth) asks YES/NO whether the
final answer matches the reference; `rubric` asks for a 0-10 score, normalised to [0, 1]. Errors
are retried with backoff, and concurrency is capped per judge URL so a big batch cannot flood the
judge; one HTTP session per URL and event loop keeps connections open across verdicts. A judge
that is down (the launcher restarts a dead one on the same URL) is waited for up to `down_wait_s`,
so what it was judging is judged again, not failed. Verdicts: what lies outside the response (a
timeout, 5xx/429 after the retries, a judge down past `down_wait_s`, refused credentials) is
*failed*, kept out of training; what the response can bring about (an unparsable answer, a request
refused for its content) scores 0. Both are counted in `JUDGE_METRICS`.

reward_args: `judge_url` (or env RLVR_JUDGE_URL), `model`, `api_key_env`, `template`, `timeout_s`,
`max_retries`, `backoff_s`, `down_wait_s`, `max_concurrency`, `temperature`, `max_tokens`
(docs/rewards.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from rlvr.rewards.args import judge_mode, reject_unknown_args
from rlvr.rewards.base import describe_exception, failed, zero
from rlvr.rewards.deadline import current as current_deadline
from rlvr.rewards.deadline import queued
from rlvr.rewards.registry import register
from rlvr.rewards.text import model_text, split_think
from rlvr.types import Completion, RewardResult, Sample

JUDGE_METRICS: Counter[str] = Counter()
"""Process-wide counters: requests, retries, down_retries (asked again while the judge was down),
timeouts, errors, refused, unparsable (the pool reports each as `reward/judge/<key>_total`)."""


REFERENCE_TEMPLATE = """You are grading a response against a reference answer.

Question:
{prompt}

Reference answer:
{reference}

Response:
{response}

Does the response's final answer match the reference answer (same meaning; formatting does \
not matter)? Think briefly, then end with a single line: YES or NO."""

RUBRIC_TEMPLATE = """You are grading the quality of a response to a question.

Question:
{prompt}

Response:
{response}

Rate correctness, completeness and clarity on a scale from 0 (useless) to 10 (perfect). \
Think briefly, then end with a line of the form: Score: N"""

_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)
# Per loop: its sessions by judge URL, and the async generator whose `finally` closes them.
_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()
_closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
_YES_NO = re.compile(r"\b(YES|NO)\b", re.IGNORECASE)
_SCORE_PATTERNS = (
    re.compile(r"score\s*[:=]?\s*\**\s*(\d+(?:\.\d+)?)\s*\**\s*(?:/\s*10)?", re.IGNORECASE),
    re.compile(r"(\d+(?:\.\d+)?)\s*\**\s*/\s*10\b"),
    re.compile(r"\*\*\s*(\d+(?:\.\d+)?)\s*\*\*"),
)


class JudgeTimeout(Exception):
    pass


class JudgeRefused(Exception):
    """The judge refused the request for its content (400/413/422): the response's doing, a 0."""


CONTENT_STATUSES = (400, 413, 422)


def parse_yes_no(text: str) -> float | None:
    """1.0 for YES, 0.0 for NO (the last one wins: judges reason before deciding), None if neither."""
    found = _YES_NO.findall(text)
    return None if not found else float(found[-1].upper() == "YES")


def parse_rubric(text: str) -> float | None:
    """A 0-10 score normalised to [0, 1]; the last match of the most specific pattern wins."""
    for pattern in _SCORE_PATTERNS:
        found = pattern.findall(text)
        if found:
            value = float(found[-1])
            return min(max(value / 10.0, 0.0), 1.0) if value <= 10 else None
    bare = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*\.?\s*", text)
    if bare and float(bare.group(1)) <= 10:
        return float(bare.group(1)) / 10.0
    return None


def _semaphore(url: str, limit: int) -> asyncio.Semaphore:
    per_loop = _semaphores.setdefault(asyncio.get_running_loop(), {})
    if url not in per_loop:
        per_loop[url] = asyncio.Semaphore(limit)
    return per_loop[url]


async def _hold_sessions(loop: asyncio.AbstractEventLoop, sessions: dict[str, Any]) -> AsyncIterator[None]:
    """Suspended for the loop's life; the loop's shutdown (or `close_sessions`) runs its finally,
    which also forgets the loop (the generator references it, so an entry left behind would
    keep a finished loop alive)."""
    try:
        yield
    finally:
        _closers.pop(loop, None)
        if _sessions.get(loop) is sessions:
            del _sessions[loop]
        for session in list(sessions.values()):
            await session.close()
        sessions.clear()


async def _session(url: str) -> Any:
    """This loop's one session for the judge at `url` (keep-alive; the per-URL cap bounds its
    connections, so the connector itself sets none)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    sessions = _sessions.get(loop)
    if sessions is None:
        sessions = _sessions[loop] = {}
        closer = _closers[loop] = _hold_sessions(loop, sessions)
        await anext(closer)  # started on this loop, so its shutdown_asyncgens closes it
    session = sessions.get(url)
    if session is None or session.closed:
        session = sessions[url] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    return session


def close_sessions() -> None:
    """Close every judge session of every event loop (safe to call twice, from any thread).

    A loop that is stopped (the rollout manager's, after its thread ends) runs the close itself;
    one running on another thread gets it scheduled and waited for; on the calling thread's own
    running loop it is scheduled (use `aclose_sessions` there to wait)."""
    for loop, closer in list(_closers.items()):
        if loop.is_closed():
            _closers.pop(loop, None)
            _sessions.pop(loop, None)
            continue
        if not loop.is_running():
            loop.run_until_complete(closer.aclose())
            continue
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(closer.aclose())
        else:
            with contextlib.suppress(TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(closer.aclose(), loop).result(timeout=10)


async def aclose_sessions() -> None:
    """Close this loop's judge sessions and wait for it."""
    closer = _closers.get(asyncio.get_running_loop())
    if closer is not None:
        await closer.aclose()


class _Retry(Exception):
    """A 5xx/429 answer: the judge is up but could not answer; retried up to `max_retries` times."""


class _JudgeDown(Exception):
    """No connection, or 502/503: the judge is not there (the launcher may be restarting it)."""


DOWN_STATUSES = (502, 503)
DOWN_BACKOFF_CAP_S = 2.0  # a restarted judge is asked again within this of coming back
_down_since: dict[str, float] = {}
"""Per endpoint, process-wide: when it was found down (monotonic), until it answers again. Shared so
that a judge down for good fails each call at once once `down_wait_s` has passed, not after a wait
of its own per call: calls queue `max_concurrency` at a time, and a step would wait one
`down_wait_s` per batch."""


async def _post(session: Any, endpoint: str, *, timeout_s: float, **request: Any) -> str:
    """One request: the answer's text, or the exception that says what kind of failure it was."""
    import aiohttp

    try:
        async with session.post(endpoint, timeout=aiohttp.ClientTimeout(total=timeout_s), **request) as response:
            if response.status in DOWN_STATUSES:  # a proxy in front of a judge that is not up (yet)
                raise _JudgeDown(f"HTTP {response.status}")
            _down_since.pop(endpoint, None)  # any other answer: the judge is up
            if response.status >= 500 or response.status == 429:
                raise _Retry(f"HTTP {response.status}")
            if response.status in CONTENT_STATUSES:
                raise JudgeRefused(f"HTTP {response.status}: {(await response.text())[:200]}")
            if response.status >= 400:
                raise RuntimeError(f"judge returned HTTP {response.status}: {(await response.text())[:200]}")
            payload = await response.json(content_type=None)
            return payload["choices"][0]["message"]["content"] or ""
    except TimeoutError as exc:  # before ClientConnectionError: aiohttp's own timeouts are both
        raise JudgeTimeout(f"no answer within {timeout_s}s") from exc
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:  # refused, dropped, cut mid-answer
        raise _JudgeDown(describe_exception(exc)) from exc


async def _wait_while_down(url: str, endpoint: str, down: _JudgeDown, *, down_wait_s: float, delay: float) -> None:
    """Wait `delay` (capped) before asking a judge found down again; RuntimeError, naming the URL and
    the wait, once it has been down for `down_wait_s`.

    The pool's deadline is paused meanwhile: a judge being restarted is not the call's own time,
    and the default `down_wait_s` would otherwise run into `rewards.call_timeout_s` (deadline.py)."""
    waited = time.monotonic() - _down_since.setdefault(endpoint, time.monotonic())
    if waited >= down_wait_s:
        raise RuntimeError(f"judge {url} was down for {waited:.1f} s (down_wait_s = {down_wait_s:g}): {down}")
    JUDGE_METRICS["down_retries"] += 1
    deadline = current_deadline.get()
    if deadline is not None:
        deadline.pause()
    try:
        await asyncio.sleep(min(delay, DOWN_BACKOFF_CAP_S, down_wait_s - waited))
    finally:
        if deadline is not None:
            deadline.resume()


async def chat(
    url: str,
    messages: list[dict[str, str]],
    *,
    model: str,
    api_key: str | None,
    timeout_s: float,
    max_retries: int,
    backoff_s: float,
    down_wait_s: float = 0.0,
    temperature: float = 0.0,
    max_tokens: int = 512,
) -> str:
    """One chat completion with retries; raises JudgeTimeout or RuntimeError when it gives up,
    JudgeRefused when the judge refuses the request itself.

    A judge that is down (no connection, 502/503) is asked again until `down_wait_s` has passed
    since it was found down, without using up `max_retries`: the launcher restarts a dead judge
    on the same URL, and what it was judging must be judged again, not failed. With
    `down_wait_s = 0` a judge that is down is one more failure for `max_retries` to retry."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
    endpoint = url.rstrip("/") + ("" if url.rstrip("/").endswith("/v1") else "/v1") + "/chat/completions"
    session = await _session(url)
    retries = down_retries = 0
    while True:
        JUDGE_METRICS["requests"] += 1
        try:
            return await _post(session, endpoint, timeout_s=timeout_s, json=body, headers=headers)
        except _JudgeDown as exc:
            error: Exception = exc
            if down_wait_s > 0:
                delay = max(backoff_s, 0.1) * 2 ** min(down_retries, 5)
                await _wait_while_down(url, endpoint, exc, down_wait_s=down_wait_s, delay=delay)
                down_retries += 1
                continue
        except _Retry as exc:
            error = exc
        if retries >= max_retries:
            raise RuntimeError(f"judge {url} failed after {retries + 1} attempts: {error}")
        retries += 1
        JUDGE_METRICS["retries"] += 1
        await asyncio.sleep(backoff_s * 2 ** (retries - 1))


async def check_judge(
    url: str, *, api_key: str | None = None, attempts: int = 3, timeout_s: float = 10.0
) -> str | None:
    """None when the judge at `url` answers (`GET /v1/models`), else why not, in a few words.

    Run before step 1: a judge that is down would otherwise show up as a step of failed verdicts.
    Any HTTP answer below 500 but 401/403 means the server is up (a 404: it has no model list).
    """
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    endpoint = url.rstrip("/") + ("" if url.rstrip("/").endswith("/v1") else "/v1") + "/models"
    problem = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(2.0 * attempt)
            try:
                async with session.get(endpoint, headers=headers) as response:
                    if response.status in (401, 403):
                        return f"refuses the API key (HTTP {response.status})"
                    if response.status < 500:
                        return None
                    problem = f"HTTP {response.status}"
            except TimeoutError:
                problem = f"no answer within {timeout_s:g} s"
            except aiohttp.ClientError as exc:
                problem = describe_exception(exc)
    return problem


def judge_urls(domains: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, list[str]]:
    """The judge URL each llm_judge domain calls (its `judge_url`, else RLVR_JUDGE_URL): url -> domains."""
    urls: dict[str, list[str]] = {}
    for name, (reward, args) in domains.items():
        url = (args or {}).get("judge_url") or os.environ.get("RLVR_JUDGE_URL") if reward == "llm_judge" else None
        if url:
            urls.setdefault(str(url), []).append(name)
    return urls


@register("llm_judge")
async def score(sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Ask an OpenAI-compatible judge model: YES/NO against the reference or a 0-10 rubric."""
    reject_unknown_args("llm_judge", reward_args)
    url = reward_args.get("judge_url") or os.environ.get("RLVR_JUDGE_URL")
    if not url:
        raise ValueError("llm_judge needs reward_args judge_url or the RLVR_JUDGE_URL environment variable")
    template = reward_args.get("template") or ("reference" if sample.ground_truth is not None else "rubric")
    text = model_text(completion)
    response = split_think(text)[0].strip()
    if not response:
        return zero("empty response")
    mode = judge_mode(template)
    if mode == "reference" and sample.ground_truth is None:
        return failed("reference template but the sample has no ground_truth", error=True)
    body = {"reference": REFERENCE_TEMPLATE, "rubric": RUBRIC_TEMPLATE}.get(template, template)
    prompt = body.format(prompt=sample.prompt_text, response=response[:20000], reference=sample.ground_truth)
    key_env = reward_args.get("api_key_env")
    api_key = os.environ.get(key_env) if key_env else None
    timeout_s = float(reward_args.get("timeout_s", 30.0))
    try:
        async with queued(_semaphore(url, int(reward_args.get("max_concurrency", 16)))):
            answer = await chat(
                url,
                [{"role": "user", "content": prompt}],
                model=str(reward_args.get("model", "judge")),
                api_key=api_key,
                timeout_s=timeout_s,
                max_retries=int(reward_args.get("max_retries", 3)),
                backoff_s=float(reward_args.get("backoff_s", 0.5)),
                down_wait_s=float(reward_args.get("down_wait_s", 120.0)),
                temperature=float(reward_args.get("temperature", 0.0)),
                max_tokens=int(reward_args.get("max_tokens", 512)),
            )
    except JudgeTimeout:
        JUDGE_METRICS["timeouts"] += 1
        return failed(f"judge {url} gave no answer within {timeout_s:g} s", timeout=True)
    except JudgeRefused as exc:
        JUDGE_METRICS["refused"] += 1
        return zero(f"judge refused the request: {exc}"[:300])
    except RuntimeError as exc:
        JUDGE_METRICS["errors"] += 1
        return failed(str(exc)[:300], error=True)
    value = parse_yes_no(answer) if mode == "reference" else parse_rubric(answer)
    if value is None:
        JUDGE_METRICS["unparsable"] += 1
        return zero("unparsable judge answer", judge=answer[-200:])
    return RewardResult(value, {"reason": f"judge: {mode}", "judge": answer[-200:]})
