"""The reward contract: what every reward (built-in or plug-in) promises the RL loop.

A reward is an async callable, or an object with such a `score` method::

    async def score(sample: Sample, completion: Completion, **reward_args) -> RewardResult

Every call ends in a verdict: a score for anything the model's output can bring about (malformed
output, runaway code, attacks on the judge score 0 with `info["reason"]`; a reward never raises on
bad output), or *failed* (`failed(cause)`, an exception, a non-number) only for what lies outside
the sample: a judge that is down, a sandbox that could not start, a bad `reward_args` value. The
line matters because a failed sample is not trained on: a policy that could earn one on purpose
would learn to abstain whenever it is unsure (docs/rewards.md, "Verdicts").
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from rlvr.types import Completion, RewardResult, Sample

RewardFn = Callable[..., Awaitable[RewardResult]]
"""The normalised shape `get_reward` returns: `await fn(sample, completion, **reward_args)`."""


class Reward(Protocol):
    """A reward object: anything with an async `score` method of the contract's signature."""

    async def score(self, sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult: ...


def zero(reason: str, **info: Any) -> RewardResult:
    """Score 0 with a reason: the answer for malformed output, the solution's own timeouts and kills."""
    return RewardResult(0.0, {"reason": reason, **info})


def failed(cause: str, **info: Any) -> RewardResult:
    """Could not judge, with the cause: the sample leaves training (see the module docstring)."""
    cause = cause[:500]
    return RewardResult(0.0, {"reason": cause, **info}, failed=cause)


def describe_exception(exc: BaseException) -> str:
    """`Type: message` on one line (the cause a failed verdict and the budget's stop line show)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def coerce_result(value: Any) -> RewardResult:
    """Accept what plug-ins naturally return (float, int, bool, RewardResult) as a RewardResult.

    Anything else (a string, None, NaN, inf) is a reward that did not produce a number: failed,
    not a 0 to train on (and not a NaN to poison the advantages).
    """
    if isinstance(value, RewardResult):
        result = value
    elif isinstance(value, bool | int | float):
        result = RewardResult(float(value), {})
    else:
        return failed(f"reward returned {type(value).__name__} {_short_repr(value)}, expected a number or RewardResult")
    if result.failed is not None:
        return result
    try:
        score = float(result.score)
    except (TypeError, ValueError):
        return failed(f"reward returned a non-numeric score {_short_repr(result.score)}")
    if not math.isfinite(score):
        return failed(f"reward returned a non-finite score {score}")
    result.score = score
    return result


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


async def safe_score(fn: RewardFn, sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Call a reward; an exception is a failed verdict with its type and message as the cause.

    The pool calls rewards through this, so a buggy plug-in or a broken service is counted
    (`reward/<domain>/failed`) and kept out of training instead of crashing the controller.
    """
    try:
        return coerce_result(await fn(sample, completion, **reward_args))
    except Exception as exc:  # noqa: BLE001 - the contract is "never raise into the loop"
        return failed(describe_exception(exc), error=True)
