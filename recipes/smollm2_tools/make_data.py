"""Rows for recipes/smollm2_python_tool.toml and recipes/smollm2_search_tool.toml (seeded, reproducible).

python recipes/smollm2_tools/make_data.py     # rewrites data/*.jsonl

products: `What is 483 * 627?`, three digits by three, which SmolLM2-135M cannot multiply in its head.
mayors: `Who is the mayor of the town where Tavik Orlen was born?` about made-up people and towns that
only data/corpus.jsonl knows: one passage says where a person was born, another who a town's mayor is.

Each prompt opens with one worked example of the tool call (SmolLM2-135M writes none from a
description alone: measured in docs/tools.md); a mayors prompt also names the first lookup
(search-in-a-block rate 4/12 samples with it, 1/12 without), the second hop is the model's. The prompt is the same with the tool and without it
(`tool_instructions = false` in the recipes), so the no-tool twin differs only in the tool's answers.
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent / "data"

PRODUCT_SHOT = (
    "Use Python to compute. Example:\n"
    "Question: What is 215 * 348?\n"
    "```python\nprint(215 * 348)\n```\n"
    "<result>\n74820\n</result>\n"
    "The answer is \\boxed{74820}.\n\n"
    "Question: What is {a} * {b}?"
)

MAYOR_SHOT = (
    "Use Python to look facts up with search(). Example:\n"
    "Question: Who is the mayor of the town where Mira Dovel was born?\n"
    '```python\nprint(search("Mira Dovel"))\n```\n'
    "<result>\nDoc 1 Mira Dovel was born in Quelm.\n</result>\n"
    '```python\nprint(search("mayor of Quelm"))\n```\n'
    "<result>\nDoc 1 The mayor of Quelm is Ardo Vesk.\n</result>\n"
    "The answer is <answer>Ardo Vesk</answer>.\n\n"
    "Question: Who is the mayor of the town where {person} was born?\n"
    'Start with:\n```python\nprint(search("{person}"))\n```'
)

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "kr", "st", "tr"]
VOWELS = ["a", "e", "i", "o", "u"]
CODAS = ["", "", "n", "r", "l", "k", "s", "m"]


def word(rng: random.Random, syllables: int) -> str:
    """A pronounceable made-up word (no model has seen it as a fact)."""
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables)).capitalize()


def products(seed: int, count: int, start: int, avoid: set[str]) -> list[dict]:
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        question = PRODUCT_SHOT.replace("{a}", str(a)).replace("{b}", str(b))
        if question in avoid:
            continue  # held-out rows are never trained on
        avoid.add(question)
        out.append(
            {"id": f"products-{start + len(out)}", "tag": "products", "prompt": question, "ground_truth": str(a * b)}
        )
    return out


def mayors_world(seed: int, *, towns: int, people: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(town, mayor) and (person, town) pairs with unique names (the example's are never used)."""
    rng = random.Random(seed)
    used = {"Quelm", "Mira", "Dovel", "Ardo", "Vesk"}

    def fresh(syllables: int) -> str:
        while True:
            name = word(rng, syllables)
            if name not in used:
                used.add(name)
                return name

    town_mayor = [(fresh(2), f"{fresh(2)} {fresh(2)}") for _ in range(towns)]
    person_town = [(f"{fresh(2)} {fresh(2)}", rng.choice(town_mayor)[0]) for _ in range(people)]
    return town_mayor, person_town


def main() -> None:
    HERE.mkdir(exist_ok=True)
    seen: set[str] = set()
    write("products_train", products(0, 512, 0, seen))
    write("products_eval", products(1, 32, 10_000, seen))

    town_mayor, person_town = mayors_world(2, towns=64, people=512 + 32)
    mayor_of = dict(town_mayor)
    rows = [
        {
            "id": f"mayors-{i}",
            "tag": "mayors",
            "prompt": MAYOR_SHOT.replace("{person}", person),
            "ground_truth": mayor_of[town],
        }
        for i, (person, town) in enumerate(person_town)
    ]
    write("mayors_train", rows[:512])
    write("mayors_eval", rows[512:])  # held-out people: their towns are in the corpus only
    corpus = [{"text": f"{person} was born in {town}."} for person, town in person_town]
    corpus += [{"text": f"The mayor of {town} is {mayor}."} for town, mayor in town_mayor]
    random.Random(3).shuffle(corpus)
    write("corpus", corpus)


def write(name: str, rows: list[dict]) -> None:
    with open(HERE / f"{name}.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
