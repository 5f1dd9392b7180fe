"""The test_cases shape code_sandbox needs, per case_type (checked when rows are loaded)."""

from __future__ import annotations

import json
import re

import pytest

from rlvr.rewards.cases import check_test_cases, normalise_test_cases

GOOD = [
    ("stdin_stdout", [{"input": "1\n", "output": "1\n"}]),
    ("stdin_stdout", json.dumps([{"input": "1\n", "output": "1\n"}])),
    ("stdin_stdout", {"inputs": ["1", "2"], "outputs": ["1", "2"]}),
    ("assert", "assert f(1) == 2"),
    ("assert", ["assert f(1) == 2", "assert f(2) == 4"]),
    ("pytest", "from solution import f\n\ndef test_f():\n    assert f(1) == 2\n"),
    ("check_based", {"test": "def check(candidate): assert candidate(1) == 2", "entry_point": "f"}),
    ("check_based", json.dumps({"test": "def check(c): pass", "entry_point": "f", "prelude": "import math"})),
]


@pytest.mark.parametrize(("case_type", "cases"), GOOD, ids=[f"{k}-{i}" for i, (k, _) in enumerate(GOOD)])
def test_runnable_cases_pass(case_type, cases):
    assert check_test_cases(case_type, cases) is None


def test_normalised_forms():
    assert normalise_test_cases("assert", "assert x") == ["assert x"]
    assert normalise_test_cases("stdin_stdout", {"inputs": ["a"], "outputs": ["b"]}) == [{"input": "a", "output": "b"}]
    assert normalise_test_cases("check_based", '{"test": "t", "entry_point": "f"}') == {"test": "t", "entry_point": "f"}


STDIN = "test_cases for case_type 'stdin_stdout' must be a non-empty list of {input, output} objects or {inputs: [...], outputs: [...]}"
ASSERT = "test_cases for case_type 'assert' must be a string or a non-empty list of strings"
CHECK = 'test_cases for case_type \'check_based\' must be an object {"test": "def check(candidate): ...", "entry_point": "f"}'
BAD = [
    ("assert", {"a": 1}, f"{ASSERT} (got dict)"),
    ("assert", ["assert x", 3], f"{ASSERT} (test_cases[1] is int)"),
    ("stdin_stdout", [{"output": "1"}], f"{STDIN} (test_cases[0] has no 'input')"),
    ("stdin_stdout", ["1"], f"{STDIN} (test_cases[0] is str)"),
    ("stdin_stdout", {"inputs": ["1", "2"], "outputs": ["1"]}, f"{STDIN} (got 2 inputs and 1 outputs)"),
    ("stdin_stdout", {"inputs": ["1"]}, f"{STDIN} (got 'inputs' without 'outputs')"),
    (
        "stdin_stdout",
        "1 2 3",
        "test_cases for case_type 'stdin_stdout' is a string but not JSON: Extra data (column 3)",
    ),
    ("pytest", ["assert f(1)"], "test_cases for case_type 'pytest' must be the text of a pytest file (got list)"),
    ("pytest", "   ", "test_cases for case_type 'pytest' must be the text of a pytest file (got a blank string)"),
    ("check_based", {"test": "def check(c): pass"}, f"{CHECK} (no 'entry_point')"),
    ("check_based", {"test": "def check(c): pass", "entry_point": 3}, f"{CHECK} ('entry_point' is int)"),
    ("check_based", ["def check(c): pass"], f"{CHECK} (got list)"),
    ("text", "x", "'case_type' must be one of stdin_stdout, assert, pytest, check_based, got 'text'"),
]


@pytest.mark.parametrize(("case_type", "cases", "message"), BAD, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BAD)])
def test_unrunnable_cases_say_what_is_expected(case_type, cases, message):
    assert check_test_cases(case_type, cases) == message
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        normalise_test_cases(case_type, cases)
