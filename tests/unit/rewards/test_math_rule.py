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


# -- what real models write: each kind decided in docs/rewards.md (math_rule) ---------------------
@pytest.mark.parametrize(
    ("gold", "text", "args", "expected"),
    [
        # inline math split over lines: accepted, as TeX reads it (a single newline in math is a space)
        ("2x+1", "The answer is $\n2x+1\n$.", {}, 1),
        ("2x+1", "So we get \\(\n  2x+1\n\\)", {}, 1),
        ("\\frac{1}{2}", "The answer is $\n\\frac{1}{2}\n$", {"fallback": "none"}, 1),
        ("2x+1", "So we get \\(\n2x+1\n\n\\)", {}, 0),  # a blank line ends the math: not joined
        ("3", "The answer is $\n3\n$", {}, 1),
        # pmatrix, bmatrix, matrix: the same entries are the same matrix, either side
        ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\boxed{\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}}", {}, 1),
        ("\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", "$\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}$", {}, 1),
        ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\boxed{\\begin{bmatrix}1&2\\\\3&5\\end{bmatrix}}", {}, 0),
        # decimals against fractions and intervals: math-verify's 6 decimal places unless float_rounding says
        ("\\frac{1}{3}", "\\boxed{0.33}", {}, 0),
        ("\\frac{1}{3}", "\\boxed{0.333333}", {}, 1),
        ("\\frac{1}{3}", "\\boxed{0.33}", {"float_rounding": 2}, 1),
        ("0.33", "\\boxed{\\frac{1}{3}}", {"float_rounding": 2}, 1),
        ("\\frac{1}{3}", "\\boxed{0.34}", {"float_rounding": 2}, 0),
        ("(\\frac{3}{5},\\frac{8}{3}]", "\\boxed{(0.6,2.67]}", {}, 0),
        ("(\\frac{3}{5},\\frac{8}{3}]", "\\boxed{(0.6,2.67]}", {"float_rounding": 2}, 1),
        # an escaped dollar is a currency sign, like the `$` of `$10`
        ("10", "\\$10", {}, 1),
        ("10", "The total cost is \\$10.", {}, 1),
        ("\\$10", "The answer is 10.", {}, 1),
        ("10.50", "It costs \\$10.50 in all.", {}, 1),
        ("10", "The total cost is \\$12.", {}, 0),
        # a trailing backslash or line break carries no value
        ("5", "\\boxed{5 \\\\}", {}, 1),
        ("\\frac{1}{2}", "The answer is $\\frac{1}{2}\\\\$", {}, 1),
        ("\\frac{1}{2}\\", "\\boxed{\\frac12}", {}, 1),
        ("10", "10\\", {}, 1),
        ("6", "\\boxed{5 \\\\}", {}, 0),
        # inequalities and intervals: an interval answer to a relation gold is compared; a relation
        # answer to an interval gold only with allow_set_relation_comp (a gold (0, 1) may be a point)
        ("x > 3", "\\boxed{(3, \\infty)}", {}, 1),
        ("-2 \\le x \\le 7", "\\boxed{[-2, 7]}", {}, 1),
        ("x \\in [-2,7]", "\\boxed{-2 \\le x \\le 7}", {}, 0),
        ("x \\in [-2,7]", "\\boxed{-2 \\le x \\le 7}", {"allow_set_relation_comp": True}, 1),
        ("(3, \\infty)", "\\boxed{x > 3}", {"allow_set_relation_comp": True}, 1),
        ("(3, \\infty)", "\\boxed{x \\ge 3}", {"allow_set_relation_comp": True}, 0),
        ("(0, 1)", "\\boxed{0 < x < 1}", {}, 0),
    ],
)
async def test_answer_kinds_real_models_write(gold, text, args, expected):
    result = await score(make_sample(ground_truth=gold), make_completion(text), **args)
    assert result.score == float(expected), result.info


def test_new_knobs_are_checked():
    from rlvr.rewards.args import check_arg_values

    assert check_arg_values("math_rule", {"float_rounding": 2, "allow_set_relation_comp": True}) is None
    assert "float_rounding" in (check_arg_values("math_rule", {"float_rounding": -1}) or "")
    assert "allow_set_relation_comp" in (check_arg_values("math_rule", {"allow_set_relation_comp": "yes"}) or "")


@pytest.mark.parametrize(
    "text",
    [
        "The multiplication table of 237 * 682 is",  # what a no-tool policy learned to end on (docs/tools.md)
        "\\boxed{237 \\times 682}",
        "The answer is 237*682.",
        "\\boxed{\\frac{323268}{2}}",
    ],
)
async def test_arithmetic_left_undone_is_not_an_integer_answer(text):
    """sympy evaluates `237 * 682`: accepting it lets the grader do the multiplication the task asks
    for, and a policy learns to restate the question. The number itself still scores."""
    sample = make_sample(ground_truth="161634")
    refused = await score(sample, make_completion(text))
    assert refused.score == 0.0 and refused.info["reason"].startswith("arithmetic left undone"), refused.info
    assert (await score(sample, make_completion(text), allow_arithmetic=True)).score == 1.0
    assert (await score(sample, make_completion("so it is 161,634"))).score == 1.0


async def test_a_worked_equation_states_its_value():
    sample = make_sample(ground_truth="39")
    assert (await score(sample, make_completion("14 + 25 = 39"))).score == 1.0
    assert (await score(sample, make_completion("so x = 13 * 3"))).score == 0.0  # the value left undone


async def test_exact_fractions_still_match_a_decimal_gold():
    assert (await score(make_sample(ground_truth="0.5"), make_completion("\\boxed{\\frac12}"))).score == 1.0
    assert (await score(make_sample(ground_truth="-3"), make_completion("the answer is -3"))).score == 1.0


def test_allow_arithmetic_is_checked():
    from rlvr.rewards.args import check_arg_values

    assert check_arg_values("math_rule", {"allow_arithmetic": True}) is None
    assert "allow_arithmetic" in (check_arg_values("math_rule", {"allow_arithmetic": "yes"}) or "")
