"""The quickstart's synthetic tasks: right answers score 1 and the warm-up's wrong answers score 0
under the real rewards, and the generated files load as data."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rlvr.data.sources import load_domain_samples
from rlvr.quickstart.tasks import ROWS, write_quickstart_data, wrong_answer
from rlvr.rewards.registry import get_reward
from rlvr.types import Completion

REWARDS = {"math": "math_rule", "code": "code_sandbox"}


@pytest.mark.parametrize("domain", sorted(REWARDS))
async def test_right_answers_score_one_and_wrong_ones_zero(tmp_path: Path, domain: str) -> None:
    write_quickstart_data(tmp_path, seed=3, train=6, eval_rows=1)
    samples = load_domain_samples(
        [str(tmp_path / f"{domain}_train.jsonl")], domain=domain, tags=[domain], reward=REWARDS[domain]
    )
    score = get_reward(REWARDS[domain])
    _, answer = ROWS[domain]
    rng = random.Random(0)
    for sample in samples[:3]:
        row = {"ground_truth": sample.ground_truth, "program": sample.extra.get("program")}
        right = await score(sample, Completion(text=answer(row), token_ids=[], logprobs=[]))
        wrong = await score(sample, Completion(text=wrong_answer(domain, row, rng), token_ids=[], logprobs=[]))
        assert (right.score, wrong.score) == (1.0, 0.0), (sample.id, right.info, wrong.info)


def test_generated_files_are_deterministic(tmp_path: Path) -> None:
    write_quickstart_data(tmp_path / "a", seed=1, train=5, eval_rows=2)
    write_quickstart_data(tmp_path / "b", seed=1, train=5, eval_rows=2)
    for name in ("math_train.jsonl", "code_eval.jsonl", "words_train.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
