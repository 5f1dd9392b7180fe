from __future__ import annotations

import pytest

from rlvr.rewards.math_rule import extract_answer, last_boxed, score
from rlvr.rewards.text import split_think
from rlvr.rewards.workers import WorkerPool

from .conftest import make_completion, make_sample

EQUAL = [
    ("1/2", "0.5"),
    (r"\frac{1}{2}", "0.5"),
    (r"\dfrac{3}{4}", "0.75"),
    (r"\{1,2\}", r"\{2,1\}"),
    (r"[1,2)", r"[1, 2)"),
    (r"(0,\infty)", r"(0, \infty)"),
    (r"10\%", "10"),
    (r"5\text{ cm}", "5"),
    (r"\sqrt{2}/2", r"\frac{1}{\sqrt{2}}"),
    ("1,000", "1000"),
    ("x=3", "3"),
    (r"2\pi", r"6.283185307"),
]
NOT_EQUAL = [
    ("3", "4"),
    ("1/2", "0.6"),
    (r"\{1,2\}", r"\{1,3\}"),
    ("(1,2)", "[1,2]"),
    (r"\sqrt{2}", "1.5"),
    ("-1", "1"),
]


@pytest.mark.parametrize(("gold", "answer"), EQUAL)
async def test_equivalent_answers_score_one(gold, answer):
    result = await score(make_sample(ground_truth=gold), make_completion(f"So the result is \\boxed{{{answer}}}."))
    assert result.score == 1.0, result.info


@pytest.mark.parametrize(("gold", "answer"), NOT_EQUAL)
async def test_different_answers_score_zero(gold, answer):
    result = await score(make_sample(ground_truth=gold), make_completion(f"\\boxed{{{answer}}}"))
    assert result.score == 0.0 and result.info["reason"] == "not equivalent", result.info


def test_extraction_order_and_brace_matching():
    assert last_boxed(r"\boxed{1} then \boxed{\frac{a}{b^{2}}}") == r"\frac{a}{b^{2}}"
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed(r"\boxed{unclosed") is None
    assert extract_answer("so the answer is $42$.") == ("42", "answer_is")
    assert extract_answer("blah\nAnswer: 17\n") == ("17", "answer_colon")
    assert extract_answer("I got 3 then 5 apples") == ("5", "last_number")
    assert extract_answer("I got 3 then 5 apples", fallback="none") == (None, "none")


def test_think_split():
    assert split_think("<think>3</think> final 4") == (" final 4", True)
    assert split_think("<think> still thinking 4") == ("<think> still thinking 4", False)


async def test_think_reasoning_is_ignored_and_unclosed_think_is_judged():
    sample = make_sample(ground_truth="4")
    wrong_after_think = await score(sample, make_completion("<think>\\boxed{4}</think> The answer is \\boxed{5}"))
    assert wrong_after_think.score == 0.0
    # ROLL zeroes any response containing <think>; an unclosed one is judged as a whole here.
    unclosed = await score(sample, make_completion("<think> 2+2 is \\boxed{4}"))
    assert unclosed.score == 1.0


async def test_fallback_is_configurable():
    sample = make_sample(ground_truth="12")
    assert (await score(sample, make_completion("I computed 12"))).score == 1.0
    none = await score(sample, make_completion("I computed 12"), fallback="none")
    assert none.score == 0.0 and none.info["reason"] == "no answer found"


async def test_format_weight():
    sample = make_sample(ground_truth="2")
    boxed_wrong = await score(sample, make_completion("\\boxed{3}"), format_weight=0.2)
    assert boxed_wrong.score == pytest.approx(0.2)
    unboxed_right = await score(sample, make_completion("the answer is 2"), format_weight=0.2)
    assert unboxed_right.score == pytest.approx(0.8)
    need_think = await score(sample, make_completion("\\boxed{2}"), format_weight=0.5, require_think=True)
    assert need_think.score == pytest.approx(0.5)
    with_think = await score(
        sample, make_completion("<think>hm</think>\\boxed{2}"), format_weight=0.5, require_think=True
    )
    assert with_think.score == pytest.approx(1.0)


async def test_list_of_golds_and_bad_args():
    sample = make_sample(ground_truth=["7", r"\frac{14}{2}"])
    assert (await score(sample, make_completion("\\boxed{7.0}"))).score == 1.0
    with pytest.raises(ValueError, match="unknown reward_args"):
        await score(sample, make_completion("x"), tolerance=1)


async def test_stuck_worker_is_killed_and_replaced():
    pool = WorkerPool(max_workers=1)
    try:
        stuck = await pool.call("time:sleep", 30, timeout_s=0.5)
        assert stuck.status == "timeout"
        ok = await pool.call("math:hypot", 3, 4, timeout_s=30)
        assert ok.status == "ok" and ok.value == 5.0
        error = await pool.call("math:sqrt", -1, timeout_s=30)
        assert error.status == "error" and "ValueError" in error.error
        assert pool.stats.timeouts == 1 and pool.stats.restarts == 1
    finally:
        pool.close()
