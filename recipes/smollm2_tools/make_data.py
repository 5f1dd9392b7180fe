"""Rows for recipes/smollm2_python_tool.toml and recipes/smollm2_search_tool.toml (seeded, reproducible).

python recipes/smollm2_tools/make_data.py     # rewrites data/*.jsonl

products: `What is 483 * 627?`, three digits by three, which SmolLM2-135M cannot multiply in its head;
each prompt opens with one worked example of the call (SmolLM2-135M writes none from a description
alone: measured in docs/tools.md).
mayors: `Who is the mayor of the town where Lena Ives was born? Use search().` about people and made-up
towns that only data/corpus.jsonl knows: one passage says where a person was born, another who a
town's mayor is. Each row holds two solved questions as earlier chat turns, the two lookups and the
answer written out: SmolLM2-135M copies its own earlier turns (two-hop episodes in about 0.4 of its
T = 0.7 samples) far more often than an example inside one message (none reached the second hop).
The prompts are the same with the tool and without it (`tool_instructions = false` in the recipes),
so the no-tool twin differs only in the tool's answers.
"""

import json
import random
from collections.abc import Callable
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

# Two solved questions as earlier turns of the chat: SmolLM2-135M copies the shape of its own earlier
# answers far better than an example inside one user message (docs/tools.md has the base rates).
MAYOR_QUESTION = "Who is the mayor of the town where {person} was born? Use search()."
MAYOR_EXAMPLES = (("Lisa Wong", "Quelm", "Tom Pike"), ("Ravi Shah", "Dunmar", "Eva Stone"))


def mayor_trace(person: str, town: str, mayor: str) -> str:
    """The episode the prompt shows: two lookups, their results, the tagged answer."""
    return (
        f'```python\nprint(search("{person}"))\n```\n<result>\nDoc 1 {person} was born in {town}.\n</result>\n'
        f'```python\nprint(search("mayor of {town}"))\n```\n<result>\nDoc 1 The mayor of {town} is {mayor}.\n</result>\n'
        f"The answer is <answer>{mayor}</answer>."
    )


def mayor_messages(person: str) -> list[dict[str, str]]:
    shots = [
        turn
        for p, t, m in MAYOR_EXAMPLES
        for turn in ({"role": "user", "content": MAYOR_QUESTION.format(person=p)},
                     {"role": "assistant", "content": mayor_trace(p, t, m)})
    ]  # fmt: skip
    return [*shots, {"role": "user", "content": MAYOR_QUESTION.format(person=person)}]


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


FIRST = [
    "Anna",
    "Ben",
    "Clara",
    "David",
    "Emma",
    "Felix",
    "Grace",
    "Henry",
    "Ida",
    "Jack",
    "Kate",
    "Leo",
    "Mia",
    "Noah",
    "Olga",
    "Paul",
    "Rosa",
    "Sam",
    "Tina",
    "Victor",
    "Wendy",
    "Yusuf",
    "Zoe",
    "Omar",
    "Lena",
    "Hugo",
    "Nina",
    "Igor",
    "Alice",
    "Bruno",
    "Carmen",
    "Dmitri",
    "Elena",
    "Frank",
    "Gina",
    "Hassan",
    "Irene",
    "Jonas",
    "Karl",
    "Lucy",
]
LAST = [
    "Berg",
    "Cole",
    "Diaz",
    "Ford",
    "Grant",
    "Hale",
    "Ives",
    "Kemp",
    "Lund",
    "Moss",
    "Nash",
    "Orr",
    "Park",
    "Quinn",
    "Reed",
    "Shaw",
    "Todd",
    "Vale",
    "Wade",
    "York",
    "Blake",
    "Crane",
    "Drake",
    "Frost",
    "Gray",
    "Hunt",
    "Lake",
    "Marsh",
    "Novak",
    "Olsen",
    "Pratt",
    "Rossi",
    "Sato",
    "Tran",
    "Ueda",
    "Vance",
    "Webb",
    "Young",
    "Zell",
    "Adler",
]


def mayors_world(seed: int, *, towns: int, people: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(town, mayor) and (person, town) pairs: made-up towns, common first and last names (short
    tokens the model copies well), every name used once (the examples' never)."""
    rng = random.Random(seed)
    used = {name for example in MAYOR_EXAMPLES for name in example}

    def fresh(make: Callable[[], str]) -> str:
        while True:
            name = make()
            if name not in used:
                used.add(name)
                return name

    def full_name() -> str:
        return f"{rng.choice(FIRST)} {rng.choice(LAST)}"

    town_mayor = [(fresh(lambda: word(rng, 2)), fresh(full_name)) for _ in range(towns)]
    person_town = [(fresh(full_name), rng.choice(town_mayor)[0]) for _ in range(people)]
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
            "messages": mayor_messages(person),
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
