"""Three tiny synthetic domains for the quickstart: math, code and a judged task.

Everything is short and character-level so a sub-megabyte model can attempt it on a CPU:

- math: `12+7=?` answered as `\\boxed{19}`, checked by `math_rule`;
- code: `prog: rev` answered with a fenced program, checked by `code_sandbox` on stdin/stdout;
- words: `opposite of hot?` answered with a word, checked by `llm_judge` against a reference.

`pretrain.py` warms a model up on *noisy* versions of these answers (a share of them
deliberately wrong), so the starting policy is right only part of the time and RL has
a clear signal to climb: that is what makes the reward rise visibly within minutes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

MATH_MAX = 20

PROGRAMS = {
    "sum": ("print(sum(map(int,input().split())))", lambda s: str(sum(map(int, s.split())))),
    "max": ("print(max(map(int,input().split())))", lambda s: str(max(map(int, s.split())))),
    "rev": ("print(input()[::-1])", lambda s: s[::-1]),
    "upper": ("print(input().upper())", lambda s: s.upper()),
    "len": ("print(len(input()))", lambda s: str(len(s))),
}

OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "left": "right", "day": "night", "fast": "slow",
    "old": "new", "wet": "dry", "high": "low", "open": "shut", "in": "out", "yes": "no",
    "win": "lose", "full": "empty", "hard": "soft", "light": "dark", "first": "last", "near": "far",
}  # fmt: skip


def math_row(rng: random.Random, index: int) -> dict:
    a, b = rng.randint(0, MATH_MAX), rng.randint(0, MATH_MAX)
    return {"id": f"math-{index}", "tag": "math", "prompt": f"{a}+{b}=?", "ground_truth": str(a + b)}


def math_answer(row: dict) -> str:
    return f"\\boxed{{{row['ground_truth']}}}"


def code_row(rng: random.Random, index: int) -> dict:
    name = rng.choice(sorted(PROGRAMS))
    _, solve = PROGRAMS[name]
    inputs = []
    for _ in range(2):
        if name in ("sum", "max"):
            inputs.append(f"{rng.randint(0, 9)} {rng.randint(0, 9)}")
        else:
            inputs.append("".join(rng.choice("abcdef") for _ in range(rng.randint(2, 5))))
    cases = [{"input": x + "\n", "output": solve(x) + "\n"} for x in inputs]
    return {"id": f"code-{index}", "tag": "code", "prompt": f"prog: {name}", "case_type": "stdin_stdout",
            "test_cases": cases, "program": name}  # fmt: skip


def code_answer(row: dict) -> str:
    return f"```python\n{PROGRAMS[row['program']][0]}\n```"


def word_row(rng: random.Random, index: int) -> dict:
    word = rng.choice(sorted(OPPOSITES))
    return {"id": f"words-{index}", "tag": "words", "prompt": f"opposite of {word}?", "ground_truth": OPPOSITES[word]}


def word_answer(row: dict) -> str:
    return str(row["ground_truth"])


ROWS = {"math": (math_row, math_answer), "code": (code_row, code_answer), "words": (word_row, word_answer)}


def wrong_answer(domain: str, row: dict, rng: random.Random) -> str:
    """A plausible but wrong answer in the right format (the noise the warm-up learns)."""
    if domain == "math":
        delta = rng.choice([-3, -2, -1, 1, 2, 3])
        return f"\\boxed{{{max(0, int(row['ground_truth']) + delta)}}}"
    if domain == "code":
        other = rng.choice([n for n in PROGRAMS if n != row["program"]])
        return f"```python\n{PROGRAMS[other][0]}\n```"
    other = rng.choice([w for w in set(OPPOSITES.values()) if w != row["ground_truth"]])
    return other


def write_quickstart_data(out_dir: str | Path, *, seed: int = 0, train: int = 400, eval_rows: int = 40) -> None:
    """jsonl train/eval files per domain (disjoint seeds, fixed content)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for domain, (make, _) in ROWS.items():
        for split, count, offset in (("train", train, 0), ("eval", eval_rows, 10_000)):
            rng = random.Random(f"{seed}:{domain}:{split}")
            with (out / f"{domain}_{split}.jsonl").open("w") as handle:
                for i in range(count):
                    handle.write(json.dumps(make(rng, offset + i)) + "\n")
