"""The tools quickstart's two domains: tasks a tiny model cannot do alone but can with a tool.

- math: `123*456=?` answered `\\boxed{56088}`, checked by `math_rule` (anchored answers only).
  No sub-megabyte char-level model multiplies 3-digit numbers in its head; with the python
  tool it writes `<code>print(123*456)</code>` and copies the `<result>`.
- facts: `where is kavomi?` answered with a city, checked by `qa_match`. The entities are
  made up (`corpus.jsonl`, one passage each, shipped with the recipe), so only `<search>`
  knows where one lives; the warm-up and the RL rows use disjoint entities, so nothing can
  be remembered from the warm-up either.

`tools_pretrain.py` warms a model up on episodes that call the tool only some of the time
(and otherwise guess), so RL has a clear choice to learn: call the tool.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CITIES = ["quellon", "barsk", "tiramo", "vessin", "oldrun", "pexley", "marvik", "sundra", "yorrel", "ambrin"]
ENTITIES = 600
# Entities [0, 200) are the warm-up's, [200, 540) the RL train rows', [540, 600) eval's.
SPLITS = {"warmup": (0, 200), "train": (200, 540), "eval": (540, 600)}
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


def entities(seed: int) -> list[tuple[str, str]]:
    """(name, city) of every made-up entity: distinct 3-syllable names, a random city each."""
    rng = random.Random(f"{seed}:entities")
    names: list[str] = []
    while len(names) < ENTITIES:
        name = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(3))
        if name not in names:
            names.append(name)
    return [(name, rng.choice(CITIES)) for name in names]


def passage(name: str, city: str) -> dict:
    return {"text": f"{name} lives in {city}."}


def math_row(rng: random.Random, index: int) -> dict:
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    return {"id": f"math-{index}", "tag": "math", "prompt": f"{a}*{b}=?", "ground_truth": str(a * b), "args": [a, b]}


def fact_row(name: str, city: str, index: int) -> dict:
    return {"id": f"facts-{index}", "tag": "facts", "prompt": f"where is {name}?", "ground_truth": city}


def rows(domain: str, split: str, *, seed: int, count: int) -> list[dict]:
    """`count` rows of a domain's split (math: random products; facts: the split's entities)."""
    rng = random.Random(f"{seed}:{domain}:{split}")
    offset = 10_000 if split == "eval" else 0  # ids unique across a domain's train and eval files
    if domain == "math":
        return [math_row(rng, offset + i) for i in range(count)]
    lo, hi = SPLITS[split]
    pool = entities(seed)[lo:hi]
    return [fact_row(*pool[i % len(pool)], offset + i) for i in rng.sample(range(count), count)]


def math_call(row: dict) -> str:
    a, b = row["args"]
    return f"<code>print({a}*{b})</code>"


def fact_call(row: dict) -> str:
    return f"<search>{row['prompt'].removeprefix('where is ').rstrip('?')}</search>"


def math_answer(value: str) -> str:
    return f"\\boxed{{{value}}}"


def guess(domain: str, row: dict, rng: random.Random) -> str:
    """An answer without the tool: a near miss for a product, any city for an entity."""
    if domain == "math":
        truth = int(row["ground_truth"])
        return math_answer(str(truth + rng.choice([-1, 1]) * rng.randint(1, truth // 20)))
    return rng.choice(CITIES)


def write_tools_data(out_dir: str | Path, *, seed: int = 0, train: int = 400, eval_rows: int = 60) -> None:
    """The search corpus and jsonl train/eval rows per domain (deterministic for a seed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w") as handle:
        for name, city in entities(seed):
            handle.write(json.dumps(passage(name, city)) + "\n")
    for domain in ("math", "facts"):
        for split, count in (("train", train), ("eval", eval_rows)):
            with (out / f"{domain}_{split}.jsonl").open("w") as handle:
                for row in rows(domain, split, seed=seed, count=count):
                    handle.write(json.dumps(row) + "\n")
