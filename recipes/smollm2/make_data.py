"""Rows for recipes/smollm2.toml: two-digit additions in words, answered in \\boxed{} (seeded, reproducible).

python recipes/smollm2/make_data.py     # rewrites data/sums_{train,eval}.jsonl
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent / "data"


def rows(seed: int, count: int, start: int, avoid: set[str]) -> list[dict]:
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        question = f"What is {a} + {b}? Put the final answer in \\boxed{{}}."
        if question in avoid:
            continue  # held-out rows are never trained on
        avoid.add(question)
        out.append({"id": f"sums-{start + len(out)}", "tag": "sums", "prompt": question, "ground_truth": str(a + b)})
    return out


seen: set[str] = set()
for name, seed, count, start in (("train", 0, 512, 0), ("eval", 1, 64, 10_000)):
    with open(HERE / f"sums_{name}.jsonl", "w") as f:
        for row in rows(seed, count, start, seen):
            f.write(json.dumps(row) + "\n")
