"""The reward contract: what every reward (built-in or plug-in) promises the RL loop.

A reward is an async callable::

    async def score(sample: Sample, completion: Completion, **reward_args) -> RewardResult

or an object with such a `score` method. `reward_args` are the domain's `reward_args` from
the recipe. The one hard rule: **a reward never raises on bad model output**. Policies emit
garbage (empty strings, 100 kB of repetition, unclosed tags, code that forks forever), and one
exception would stop a multi-node run; malformed output scores 0 with `info["reason"]` saying
why, so `rlvr rewards check` and the dashboard can show it. Exceptions are reserved for
configuration errors (a bad `reward_args` value), and even those are caught by `safe_score`
at the pool boundary and reported as `reason = "error: ..."`.
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
    """Score 0 with a reason: the answer for malformed output, timeouts and sandbox kills."""
    return RewardResult(0.0, {"reason": reason, **info})


def coerce_result(value: Any) -> RewardResult:
    """Accept what plug-ins naturally return (float, int, bool, RewardResult) as a RewardResult.

    A NaN/inf or non-numeric score is treated as malformed (0 with a reason) rather than
    poisoning the advantage computation downstream.
    """
    if isinstance(value, RewardResult):
        result = value
    elif isinstance(value, bool | int | float):
        result = RewardResult(float(value), {})
    else:
        return zero(f"reward returned {type(value).__name__}, expected float or RewardResult")
    try:
        score = float(result.score)
    except (TypeError, ValueError):
        return zero(f"reward returned a non-numeric score {result.score!r}")
    if not math.isfinite(score):
        return zero(f"reward returned a non-finite score {score}")
    result.score = score
    return result


async def safe_score(fn: RewardFn, sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Call a reward and turn any exception into a 0 with `reason = "error: ..."`.

    The pool calls rewards through this so that a buggy plug-in degrades to zeros (counted
    as errors in the metrics) instead of crashing the controller.
    """
    try:
        return coerce_result(await fn(sample, completion, **reward_args))
    except Exception as exc:  # noqa: BLE001 - the contract is "never raise into the loop"
        return zero(f"error: {type(exc).__name__}: {exc}"[:500], error=True)
