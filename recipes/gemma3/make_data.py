"""Rows for recipes/gemma3_sums.toml: few-shot additions for the Gemma 3 270M base model (seeded, reproducible).

The base model has no chat template, so rlvr renders a row's messages `plain` (`user: ...` and
`assistant: ...` lines, `<bos>` first). Each row is a short few-shot conversation: SHOTS solved sums
as user/assistant turns, then the question; the model answers with the number and the recipe stops
the answer at the end of its line (rollout.stop = ["\\n"]); `math_rule` reads the number.

The task, a two-digit number plus a one-digit one without a carry (`2d+1d-nocarry`, 6 shots), is the
candidate the base model solves partly: 0.359 greedy on the 64 eval rows. The other candidates
(`--task`, `--shots`) scored: 1d+1d 0.188 (3 shots) / 0.203 (8), 2d+1d 0.156 / 0.125, 2d+2d 0.016,
1d+2d 0.094 / 0.031, 2d+1 0.797, 2d+10 0.516, 2d+easy (a mix of small constants) 0.109, 2d+c (one
constant per row) 0.281, 2d+1d-nocarry 0.219 (3 shots) / 0.359 (6). Eval questions are distinct
and never trained on; training rows may repeat a question with other shots.

    python recipes/gemma3/make_data.py            # rewrites data/sums_{train,eval}.jsonl
    python recipes/gemma3/make_data.py --task 2d+c --shots 3 --out /tmp/cand   # another candidate
"""

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).parent / "data"
SHOTS = 6
TASKS = {  # name: (first operands, second operands)
    "1d+1d": (range(1, 10), range(1, 10)),
    "2d+1d": (range(10, 100), range(1, 10)),
    "2d+2d": (range(10, 100), range(10, 100)),
    "1d+2d": (range(1, 10), range(10, 31)),
    "2d+1": (range(10, 100), [1]),
    "2d+10": (range(10, 90), [10]),
    "2d+easy": (range(10, 90), [1, 2, 3, 10, 20]),
    "2d+1d-nocarry": (range(10, 100), range(1, 10)),
    "2d+c": (range(10, 90), [2, 3, 5, 10, 20]),  # one constant per row, in its shots and its question
}


def rows(
    task: str, seed: int, count: int, start: int, avoid: set[str], *, distinct: bool, shots: int = SHOTS
) -> list[dict]:
    """`count` rows whose question is not in `avoid`; with `distinct`, no question twice (and each is
    added to `avoid`: the eval questions, never trained on)."""
    firsts, seconds = TASKS[task]
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        pairs = [(rng.choice(firsts), rng.choice(seconds)) for _ in range(shots + 1)]
        if task == "2d+c":
            pairs = [(a, pairs[0][1]) for a, _ in pairs]
        if task.endswith("-nocarry") and any(a % 10 + b % 10 >= 10 for a, b in pairs):
            continue
        question = f"{pairs[-1][0]} + {pairs[-1][1]} ="
        if question in avoid:
            continue
        if distinct:
            avoid.add(question)
        messages = []
        for a, b in pairs[:-1]:
            messages += [{"role": "user", "content": f"{a} + {b} ="}, {"role": "assistant", "content": str(a + b)}]
        messages.append({"role": "user", "content": question})
        a, b = pairs[-1]
        out.append({"id": f"sums-{start + len(out)}", "tag": "sums", "messages": messages, "ground_truth": str(a + b)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="2d+1d-nocarry", choices=sorted(TASKS))
    parser.add_argument("--shots", type=int, default=SHOTS, help="solved sums before the question")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    for name, seed, count, start in (("eval", 1, 64, 10_000), ("train", 0, 512, 0)):
        with open(args.out / f"sums_{name}.jsonl", "w") as f:
            for row in rows(args.task, seed, count, start, seen, distinct=name == "eval", shots=args.shots):
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
