"""The tool showcases' shipped data (recipes/smollm2_tools): reproducible from make_data.py, and
every two-hop question answered by exactly two top-1 searches of the shipped corpus, so a model
that learns the lookups can score 1 and one that does not can only guess."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlvr.tools.search import SearchIndex
from tests.unit.script_module import load_script

DATA = Path(__file__).resolve().parents[3] / "recipes" / "smollm2_tools"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / "data" / f"{name}.jsonl").read_text().splitlines()]


def test_make_data_writes_the_shipped_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_script(DATA / "make_data.py")
    monkeypatch.setattr(module, "HERE", tmp_path)
    module.main()
    for shipped in sorted((DATA / "data").glob("*.jsonl")):
        assert (tmp_path / shipped.name).read_bytes() == shipped.read_bytes(), shipped.name


def test_products_are_right_and_held_out() -> None:
    train, held_out = rows("products_train"), rows("products_eval")
    for row in train + held_out:
        a, b = map(int, re.findall(r"What is (\d+) \* (\d+)\?", row["prompt"])[-1])
        assert row["ground_truth"] == str(a * b)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}


def test_each_mayor_question_takes_two_searches_of_the_shipped_corpus() -> None:
    index = SearchIndex(DATA / "data" / "corpus.jsonl")
    train, held_out = rows("mayors_train"), rows("mayors_eval")
    people = {}
    for row in train + held_out:
        question = row["messages"][-1]["content"]
        (person,) = re.findall(r"where (.+) was born\?", question)
        (first,) = index.search(person, 1)
        born = re.fullmatch(rf"{person} was born in (\w+)\.", first["text"])
        assert born, (person, first)
        (second,) = index.search(f"mayor of {born.group(1)}", 1)
        assert second["text"] == f"The mayor of {born.group(1)} is {row['ground_truth']}.", (person, second)
        prompt = " ".join(m["content"] for m in row["messages"])
        assert row["ground_truth"] not in prompt and born.group(1) not in prompt  # only the corpus knows
        people[person] = row["id"]
    assert len(people) == len(train) + len(held_out)  # held-out people are asked nowhere else
