"""Every registered reward: hostile output never raises and yields a RewardResult in range."""

from __future__ import annotations

import sys

import pytest

from rlvr.rewards.base import safe_score
from rlvr.rewards.registry import builtin_names, get_reward
from rlvr.types import Completion, RewardResult

from .conftest import make_completion, make_sample, sandbox_available

GARBAGE = [
    "",
    "   \n\t",
    "\x00\x01\ufffd" * 50,
    "<think>" * 1000,
    "</think>" * 3 + "\\boxed{" * 500,
    "x" * 200_000,
    "```python\n" + "print(1)\n" * 5000 + "```",
    "```python\nimport sys; sys.exit(0)\n```",
    "\\boxed{" + "}" * 100 + "{{{",
    "The answer is " + "9" * 5000,
    "🙂 ∑ ∫ \\frac{\\frac{\\frac{1}{2}}{3}}{",
]

ARGS = {
    "math_rule": {"timeout_s": 20},
    "code_sandbox": {"timeout_s": 5},
    "llm_judge": {"judge_url": "http://127.0.0.1:9", "max_retries": 0, "down_wait_s": 0, "timeout_s": 2},
}


@pytest.mark.parametrize("name", builtin_names())
async def test_garbage_never_raises(name, tmp_path, monkeypatch):
    if name == "code_sandbox" and not sandbox_available():
        pytest.skip("bubblewrap is not usable here")
    fn = get_reward(name)
    sample = make_sample(ground_truth="42", case_type="stdin_stdout", test_cases=[{"input": "", "output": "42"}])
    if name == "gym":  # its rows carry the reasoning-gym entry its verifier reads
        entry = pytest.importorskip("reasoning_gym").create_dataset("basic_arithmetic", seed=0, size=1)[0]
        sample.extra["gym"] = {"dataset": "basic_arithmetic", "config": {}, "entry": entry}
    if name == "verifiers":  # its rows carry the task whose own rewards score it
        pytest.importorskip("verifiers")
        from .verifiers_tasksets import MODULES, toy_sums_row

        monkeypatch.setattr(sys, "path", list(sys.path))
        for module in MODULES:
            monkeypatch.delitem(sys.modules, module, raising=False)
        sample = toy_sums_row(tmp_path)
    for text in GARBAGE:
        result = await fn(sample, make_completion(text), **ARGS.get(name, {}))
        assert isinstance(result, RewardResult), (name, text[:30])
        assert 0.0 <= result.score <= 1.0
        if result.score == 0.0:
            assert result.info.get("reason"), (name, text[:30], result.info)
        if name != "llm_judge":  # its judge is unreachable here: that, not the text, fails it
            assert result.judged, (name, text[:30], result.failed)
    odd = Completion(text=None, token_ids=[], logprobs=[])  # type: ignore[arg-type]
    assert (await fn(sample, odd, **ARGS.get(name, {}))).score == 0.0


async def test_safe_score_turns_exceptions_into_failed_verdicts():
    async def broken(sample, completion):
        raise RuntimeError("reward backend\n unavailable")

    result = await safe_score(broken, make_sample(), make_completion("x"))
    assert result.failed == "RuntimeError: reward backend unavailable" and result.info["error"]


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        ("1.0", "reward returned str '1.0', expected a number or RewardResult"),
        (None, "reward returned NoneType None, expected a number or RewardResult"),
        (float("nan"), "reward returned a non-finite score nan"),
        (RewardResult("high"), "reward returned a non-numeric score 'high'"),  # type: ignore[arg-type]
    ],
)
async def test_a_return_that_is_not_a_number_is_failed(value, cause):
    async def odd(sample, completion):
        return value

    result = await safe_score(odd, make_sample(), make_completion("x"))
    assert result.failed == cause and not result.judged
