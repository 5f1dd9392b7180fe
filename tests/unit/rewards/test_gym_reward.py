"""The `gym` reward: reasoning-gym's own `score_answer` on the answer its own `extract_answer` takes from
the completion; no `<answer>` block is a 0 (the verifier is not asked), a verifier that raises is a
failed verdict (never a 0 to train on)."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")  # the dev extra installs it; `pip install -e '.[gym]'`

import reasoning_gym  # noqa: E402

from rlvr.rewards import gym as gym_reward  # noqa: E402
from rlvr.rewards.base import safe_score  # noqa: E402
from rlvr.rewards.registry import check_reward_args, check_reward_name, describe, get_reward  # noqa: E402
from rlvr.types import Completion, Sample  # noqa: E402


def row(dataset: str, index: int = 0, **config) -> tuple[Sample, dict]:
    """A row as a gym domain makes it (rlvr/data/gym.py), and its entry."""
    entry = reasoning_gym.create_dataset(dataset, seed=0, size=index + 1, **config)[index]
    gym = {"dataset": dataset, "config": config, "entry": entry}
    sample = Sample(id="r", tag="t", messages=[{"role": "user", "content": entry["question"]}], extra={"gym": gym})
    return sample, entry


def said(text: str) -> Completion:
    return Completion(text=text, token_ids=[], logprobs=[])


async def test_the_right_answer_scores_one_and_a_wrong_one_zero_with_a_reason():
    score = get_reward("gym")
    sample, entry = row("basic_arithmetic")
    right = await score(sample, said(f"<think>work</think>\n<answer> {entry['answer']} </answer>"))
    wrong = await score(sample, said("<answer>12345678987654321</answer>"))
    assert right.score == 1.0 and right.judged and right.info["answer"] == entry["answer"]
    assert wrong.score == 0.0 and wrong.judged and wrong.info["reason"] == "basic_arithmetic.score_answer gave 0"


async def test_the_verdict_is_the_datasets_own_partial_credit_included():
    """propositional_logic has no single answer: its verifier checks the conclusion against the premises
    (a valid but trivial one earns 0.25, a wrong one 0.05): whatever it says is the score."""
    score = get_reward("gym")
    sample, entry = row("propositional_logic", min_vars=2, max_vars=3)
    verifier = reasoning_gym.create_dataset("propositional_logic", seed=0, min_vars=2, max_vars=3)
    for answer in (entry["metadata"]["example_answer"], "P", "((("):
        result = await score(sample, said(f"so <answer>{answer}</answer>"))
        assert result.judged and result.score == verifier.score_answer(answer, entry)
    assert (await score(sample, said(f"<answer>{entry['metadata']['example_answer']}</answer>"))).score == 1.0


async def test_the_last_answer_block_is_the_answer_as_reasoning_gym_extracts_it():
    score = get_reward("gym")
    sample, entry = row("basic_arithmetic")
    result = await score(sample, said(f"<answer>0</answer> no wait: <answer>{entry['answer']}</answer>"))
    assert result.score == 1.0


async def test_no_answer_block_is_zero_and_the_verifier_is_not_asked(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the verifier was asked")

    monkeypatch.setattr(gym_reward, "verifier", boom)
    sample, entry = row("basic_arithmetic")
    for text in (f"the answer is {entry['answer']}", "", "<answer>unclosed"):
        result = await get_reward("gym")(sample, said(text))
        assert result.judged and result.score == 0.0 and result.info["reason"] == "no <answer>...</answer> block"


async def test_a_verifier_that_raises_is_a_failed_verdict_not_a_zero():
    """basic_arithmetic's verifier reads entry["answer"]: an entry without it makes it raise."""
    sample, entry = row("basic_arithmetic")
    sample.extra["gym"]["entry"] = {"question": entry["question"], "metadata": entry["metadata"]}
    result = await safe_score(get_reward("gym"), sample, said("<answer>3</answer>"))
    assert not result.judged
    assert result.failed == "reasoning-gym basic_arithmetic.score_answer raised KeyError: 'answer'"


async def test_a_verifier_that_returns_no_number_is_failed(monkeypatch):
    class Odd:
        def score_answer(self, answer, entry):
            return "yes"

    monkeypatch.setattr(gym_reward, "verifier", lambda name, config: Odd())
    sample, _ = row("basic_arithmetic")
    result = await get_reward("gym")(sample, said("<answer>1</answer>"))
    assert result.failed == "reasoning-gym basic_arithmetic.score_answer returned 'yes', not a number"


async def test_a_row_without_its_entry_is_failed():
    sample = Sample(id="x", tag="t", messages=[{"role": "user", "content": "q"}])
    result = await get_reward("gym")(sample, said("<answer>1</answer>"))
    assert result.failed is not None and result.failed.startswith("row x: gym rows need a 'gym' object")


async def test_the_verifier_is_made_with_the_rows_config():
    """Some verifiers read their config: the row's config makes the instance that scores it."""
    sample, _ = row("basic_arithmetic", max_terms=3)
    await get_reward("gym")(sample, said("<answer>1</answer>"))
    assert gym_reward.verifier("basic_arithmetic", {"max_terms": 3}).config.max_terms == 3


def test_gym_is_a_built_in_reward_without_reward_args():
    assert check_reward_name("gym") is None
    assert ("gym", "Score the <answer> with the reasoning-gym dataset's own score_answer (rows from a gym table).") in (
        describe()
    )
    assert check_reward_args("gym", {}) is None
    assert (
        check_reward_args("gym", {"system_prompt": "x"}) == "gym does not take 'system_prompt'; it takes no reward_args"
    )
