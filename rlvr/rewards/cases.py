"""The shape `code_sandbox` needs `test_cases` in, per `case_type`; pure and torch-free.

Data loading runs `check_test_cases` on every code_sandbox row, so a row whose test cases
cannot be run (an `assert` row holding a dict, a `check_based` row without `entry_point`) is
an error naming `file:line` before a run starts, not a 0 on every sample. `normalise_test_cases`
is the same check returning the cases in one form per kind, for the reward itself:

* `stdin_stdout`: a list of `{"input", "output"}` (or `{"inputs": [...], "outputs": [...]}`),
  given as JSON text or as the decoded value -> a list of `{"input", "output"}` dicts;
* `assert`: one code string, or a non-empty list of assert strings -> a list of strings;
* `pytest`: the text of a pytest file -> that string;
* `check_based`: `{"test": ..., "entry_point": ..., "prelude"?: ...}` (or its JSON) -> that dict.
"""

from __future__ import annotations

import json
from typing import Any

SANDBOX_CASE_TYPES = ("stdin_stdout", "assert", "pytest", "check_based")
"""The case types code_sandbox runs (`rlvr.types.CASE_TYPES` also has `text`, which it does not)."""

_EXPECTED = {
    "stdin_stdout": "a non-empty list of {input, output} objects or {inputs: [...], outputs: [...]}",
    "assert": "a string or a non-empty list of strings",
    "pytest": "the text of a pytest file",
    "check_based": 'an object {"test": "def check(candidate): ...", "entry_point": "f"}',
}


def check_test_cases(case_type: Any, test_cases: Any) -> str | None:
    """None if code_sandbox can run `test_cases` as `case_type`, else the one-line reason."""
    try:
        normalise_test_cases(case_type, test_cases)
    except ValueError as exc:
        return str(exc)
    return None


def normalise_test_cases(case_type: Any, test_cases: Any) -> Any:
    """The cases in one form per kind (see the module docstring); ValueError with the reason."""
    if case_type not in SANDBOX_CASE_TYPES:
        raise ValueError(f"'case_type' must be one of {', '.join(SANDBOX_CASE_TYPES)}, got {case_type!r}")
    cases = test_cases
    if isinstance(cases, str) and case_type in ("stdin_stdout", "check_based"):
        try:
            cases = json.loads(cases)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"test_cases for case_type {case_type!r} is a string but not JSON: {exc.msg} (column {exc.colno})"
            ) from None

    def bad(why: str) -> ValueError:
        return ValueError(f"test_cases for case_type {case_type!r} must be {_EXPECTED[case_type]} ({why})")

    if case_type == "stdin_stdout":
        if isinstance(cases, dict) and "inputs" in cases:
            inputs, outputs = cases["inputs"], cases.get("outputs")
            if outputs is None:
                raise bad("got 'inputs' without 'outputs'")
            if not isinstance(inputs, list) or not isinstance(outputs, list):
                raise bad(f"got 'inputs' as {_kind(inputs)} and 'outputs' as {_kind(outputs)}")
            if len(inputs) != len(outputs):
                raise bad(f"got {len(inputs)} inputs and {len(outputs)} outputs")
            cases = [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
        if not isinstance(cases, list) or not cases:
            raise bad(f"got {_kind(cases)}")
        for i, case in enumerate(cases):
            if not isinstance(case, dict):
                raise bad(f"test_cases[{i}] is {_kind(case)}")
            if "input" not in case:
                raise bad(f"test_cases[{i}] has no 'input'")
        return cases
    if case_type == "assert":
        items = [cases] if isinstance(cases, str) else cases
        if not isinstance(items, list) or not items:
            raise bad(f"got {_kind(cases)}")
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise bad(f"test_cases[{i}] is {_kind(item)}")
        return items
    if case_type == "pytest":
        if not isinstance(cases, str) or not cases.strip():
            raise bad(f"got {_kind(cases)}")
        return cases
    # check_based
    if not isinstance(cases, dict):
        raise bad(f"got {_kind(cases)}")
    for key in ("test", "entry_point"):
        if key not in cases:
            raise bad(f"no {key!r}")
        if not isinstance(cases[key], str) or not cases[key].strip():
            raise bad(f"{key!r} is {_kind(cases[key])}")
    if cases.get("prelude") is not None and not isinstance(cases["prelude"], str):
        raise bad(f"'prelude' is {_kind(cases['prelude'])}")
    return cases


def _kind(value: Any) -> str:
    """What a value is, for a message: `dict`, `an empty list`, `an empty string`."""
    if isinstance(value, str) and not value.strip():
        return "a blank string" if value else "an empty string"
    if isinstance(value, list | dict) and not value:
        return f"an empty {type(value).__name__}"
    return "None" if value is None else type(value).__name__
