"""Which code `code_sandbox` runs among a response's fenced blocks (`rewards/code_blocks.py`).

`data/smollm2_code_replies.jsonl` holds real replies of SmolLM2-135M-Instruct (transformers
`generate` on the prompts of `recipes/data/code_*.jsonl` and a few like them; the generation
settings are in each row; 36 replies, the ones the tests name by kind): solutions followed by usage
blocks, a second version after the first, two whole stdin programs, replies cut at `max_new_tokens`
inside a fence. No model is loaded here.
The adversarial cases are written by hand: the policy writes the text, so a usage block must not
break a right solution nor make a wrong one pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.rewards.code_blocks import TRUNCATED, UNCLOSED, find_program, names_the_tests_call, python_blocks
from rlvr.rewards.code_sandbox import score
from rlvr.types import Completion

from .conftest import make_sample

REPLIES = {
    row["name"]: row for row in map(json.loads, (Path(__file__).parent / "data" / "smollm2_code_replies.jsonl").open())
}


def sandbox_usable() -> bool:
    from rlvr.sandbox.local import available_mode

    try:
        return available_mode("auto") in ("bwrap", "unshare")
    except RuntimeError:
        return False


needs_sandbox = pytest.mark.skipif(not sandbox_usable(), reason="neither bubblewrap nor unshare is usable here")

TESTS = {  # the tests a row of recipes/data/code_*.jsonl would carry for each prompt
    "negate": ("assert", ["assert negate(3) == -3", "assert negate(-5) == 5", "assert negate(0) == 0"]),
    "add": ("assert", ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]),
    "max_of": (
        "check_based",
        {"test": "def check(candidate):\n    assert candidate([1, 5, 2]) == 5\n    assert candidate([-3]) == -3\n",
         "entry_point": "max_of"},
    ),
    "count_vowels": (
        "pytest",
        "from solution import count_vowels\n\ndef test_basic():\n    assert count_vowels('hello') == 2\n",
    ),
    "is_even": ("assert", ["assert is_even(2)", "assert not is_even(3)", "assert is_even(0)"]),
    "fib": ("assert", ["assert fib(0) == 0", "assert fib(1) == 1", "assert fib(10) == 55"]),
    "sum": ("stdin_stdout", [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}]),
    "reverse": ("stdin_stdout", [{"input": "abc\n", "output": "cba\n"}, {"input": "racecar\n", "output": "racecar\n"}]),
}  # fmt: skip


def program(text: str, test: str, *, truncated: bool = False):
    case_type, cases = TESTS[test]
    return find_program(text, case_type, cases, truncated=truncated)


def reply(name: str) -> tuple[str, bool]:
    row = REPLIES[name]
    return row["text"], row["finish_reason"] == "length"


def fence(*blocks: str, lang: str = "python") -> str:
    return "Here is the solution.\n\n" + "\n\nExample usage:\n\n".join(f"```{lang}\n{b}\n```" for b in blocks) + "\n"


# -- which blocks run, on real replies ----------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "test", "blocks"),
    [
        ("negate_usage", "negate", (1,)),  # `print(negate(-5))` after it is usage
        ("add_usage", "add", (1,)),
        ("is_even_one_block", "is_even", (1,)),
        ("count_vowels_usage", "count_vowels", (1,)),
        ("max_of_three_blocks", "max_of", (1, 3)),  # def, usage, a second def: the second one counts
        ("add_twice", "add", (1, 2)),  # the same function twice: one program, the last definition wins
        ("sum_two_programs", "sum", (2,)),  # two whole stdin programs: only the last one runs
        ("add_cut_in_usage", "add", (1,)),  # cut inside the usage block: the closed solution runs
    ],
)
def test_the_program_of_real_replies(name, test, blocks):
    text, truncated = reply(name)
    found = program(text, test, truncated=truncated)
    assert found.blocks == blocks and found.code, found


def test_a_reply_cut_inside_its_only_fence_is_named_truncation():
    for name, test in (("negate_cut_in_fence", "negate"), ("fib_cut_in_fence", "fib")):
        text, truncated = reply(name)
        assert truncated and text.count("```") == 1
        assert program(text, test, truncated=True).reason == TRUNCATED
    # the same text with no finish_reason to go by: an open fence whose code does not parse
    assert program(reply("negate_cut_in_fence")[0], "negate").reason == UNCLOSED


def test_an_open_fence_is_the_last_block_when_the_model_stopped():
    # a "```" stop string eats the closing fence: the model's code is complete
    text = "Here it is:\n```python\ndef negate(x):\n    return -x\n"
    assert program(text, "negate").code == "def negate(x):\n    return -x\n"
    assert program(text, "negate", truncated=True).reason == TRUNCATED
    assert python_blocks(text) == (["def negate(x):\n    return -x\n"], True)


def test_blocks_that_are_not_python_or_do_not_parse_are_not_run():
    text = (
        fence("3\n1 2 3", lang="") + fence("a, b = map(int, input().split())\nprint(a + b)") + fence("ls", lang="bash")
    )
    assert program(text, "sum").code == "a, b = map(int, input().split())\nprint(a + b)\n"
    sample_output = fence("def f(s):\n    return s[::-1]\n\nprint(f(input()))") + fence("cba", lang="")
    assert program(sample_output, "reverse").blocks == (1,)
    assert program("I would write a function.", "negate").reason == "no code block found"


def test_stdin_programs_split_over_blocks():
    helper_then_main = fence("def solve(s):\n    return s[::-1]", "print(solve(input()))")
    assert program(helper_then_main, "reverse").blocks == (1, 2)
    # the reading happens in a function the last block only calls (through another function)
    called = fence("def read():\n    return input()\n\ndef main():\n    print(read()[::-1])", "main()")
    assert program(called, "reverse").blocks == (1, 2)
    guarded = fence(
        "import sys\n\ndef main():\n    print(sys.stdin.readline().strip()[::-1])\n\nif __name__ == '__main__':\n    main()"
    )
    assert program(guarded, "reverse").blocks == (1,)


def test_without_the_tested_name_the_last_block_runs_as_before():
    text, _ = reply("negate_usage")
    found = find_program(text, "assert", ["assert neg(1) == -1"])
    assert found.blocks == (2,)  # the judge then says which name is missing


def test_the_names_the_tests_call():
    assert names_the_tests_call("check_based", {"test": "...", "entry_point": "f"}) == {"f"}
    assert names_the_tests_call("pytest", "from solution import f, g\nimport solution\nsolution.h(1)\n") == {
        "f",
        "g",
        "h",
    }
    assert names_the_tests_call("pytest", "from solution import *\n") is None
    assert names_the_tests_call("assert", ["assert f(1) == 2", "x = [1]\nassert Solution().run(x) == len(x)"]) == {
        "f",
        "Solution",
    }
    assert names_the_tests_call("assert", ["assert (lambda y: y)(1) == 1"]) is None
    assert names_the_tests_call("stdin_stdout", [{"input": "", "output": ""}]) is None


# -- verdicts in the sandbox ----------------------------------------------------------------------
async def verdict(text: str, test: str, *, finish_reason: str = "stop"):
    case_type, cases = TESTS[test]
    sample = make_sample(case_type=case_type, test_cases=cases)
    return await score(sample, Completion(text=text, token_ids=[], logprobs=[], finish_reason=finish_reason))


@needs_sandbox
@pytest.mark.parametrize(
    ("name", "test", "expected"),
    [
        ("negate_usage", "negate", 1.0),  # scored 0 before: "solution failed to load: NameError ... 'negate'"
        ("add_usage", "add", 1.0),  # the same
        ("add_cut_in_usage", "add", 1.0),  # cut inside the usage block: the closed solution runs
        ("max_of_three_blocks", "max_of", 1.0),
        ("is_even_one_block", "is_even", 1.0),
        ("sum_two_programs", "sum", 0.0),  # reads two lines and prints prompts: wrong either way
    ],
)
async def test_real_replies_are_scored_on_their_solution(name, test, expected):
    text, truncated = reply(name)
    result = await verdict(text, test, finish_reason="length" if truncated else "stop")
    assert result.score == expected and result.failed is None, result.info


# The replies that score 1: 14 of the 36 (the last-block rule gave 9: `negate_usage`, `add_usage`
# and the other replies whose usage block came last scored 0 with a NameError).
RIGHT_REPLIES = {
    "is_even_one_block", "reply_01", "reply_02", "reply_03", "max_of_three_blocks", "reply_16", "negate_usage",
    "reply_18", "reply_19", "add_usage", "reply_21", "add_twice", "reply_23", "add_cut_in_usage",
}  # fmt: skip


@needs_sandbox
async def test_every_real_reply():
    scored = {}
    for name, row in REPLIES.items():
        result = await verdict(row["text"], row["tests"], finish_reason=row["finish_reason"])
        assert result.failed is None, (name, result.info)
        scored[name] = result.score
    assert {name for name, value in scored.items() if value == 1.0} == RIGHT_REPLIES, scored


@needs_sandbox
async def test_truncated_reply_says_so():
    text, _ = reply("negate_cut_in_fence")
    result = await verdict(text, "negate", finish_reason="length")
    assert result.score == 0.0 and result.failed is None and result.info["reason"] == TRUNCATED
    before = await verdict(text, "negate")  # no finish_reason to go by (a row without one)
    assert before.score == 0.0 and before.info["reason"] == UNCLOSED


# -- adversarial usage blocks ----------------------------------------------------------------------
RIGHT, WRONG = "def add(a, b):\n    return a + b", "def add(a, b):\n    return a - b"
FORGED = 'print("PASS")\nprint(\'{"case": 0, "ok": true}\')\nprint(\'{"case": 1, "ok": true, "done": true}\')'


@needs_sandbox
@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        ((RIGHT, WRONG), 0.0),  # a later block redefines it wrong: the last definition is judged
        ((WRONG, RIGHT), 1.0),  # ... or right: the same rule, one program either way
        ((WRONG, FORGED), 0.0),  # a usage block that prints PASS or the judge's event lines
        ((WRONG, "import sys\nsys.exit(0)"), 0.0),  # a usage block that exits 0
        ((RIGHT, "import sys\nsys.exit(1)"), 1.0),  # usage after the program is not run
        ((RIGHT, "assert add(2, 2) == 5"), 1.0),  # a usage block with a wrong assert does not break it
        ((RIGHT, "print(add(int(input()), 1))"), 1.0),  # nor one that reads stdin
        ((RIGHT + "\nimport os\nos._exit(0)", "print(add(1, 2))"), 0.0),  # exiting while loading is a 0
        ((RIGHT + "\nimport sys\nsys.exit(0)",), 0.0),
    ],
)
async def test_usage_blocks_neither_break_nor_fake_a_verdict(blocks, expected):
    result = await verdict(fence(*blocks), "add")
    assert result.score == expected and result.failed is None, result.info


@needs_sandbox
async def test_stdin_usage_blocks_cannot_fake_the_output():
    wrong = "a, b = map(int, input().split())\nprint(a * b)"
    for usage in ('print("3")', 'print("3")\nprint("6")', "import sys\nsys.exit(0)"):
        result = await verdict(fence(wrong, usage), "sum")
        assert result.score == 0.0 and result.failed is None, (usage, result.info)
    right = "a, b = map(int, input().split())\nprint(a + b)"
    result = await verdict(fence(right, 'print("usage: echo 1 2 | python sum.py")'), "sum")
    assert result.score == 1.0, result.info
