"""The `gym` reward: reasoning-gym's own `score_answer` on the answer its own `extract_answer` takes from
the completion (or, with `answer_from`, a `\\boxed{}` or the last number); no answer is a 0 (the verifier
is not asked), a verifier that raises is a failed verdict (never a 0 to train on)."""

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


def test_gym_is_a_built_in_reward_whose_only_argument_is_answer_from():
    assert check_reward_name("gym") is None
    assert ("gym", "Score the <answer> with the reasoning-gym dataset's own score_answer (rows from a gym table).") in (
        describe()
    )
    assert check_reward_args("gym", {}) is None
    assert check_reward_args("gym", {"answer_from": ["tag", "boxed", "last_number"]}) is None
    assert check_reward_args("gym", {"system_prompt": "x"}) == "gym does not take 'system_prompt'; it takes answer_from"


@pytest.mark.parametrize("value", [["tag", "boxd"], [], "boxed", ["tag", "tag"]])
def test_answer_from_rejects_an_unknown_source_an_empty_list_or_a_repeat(value):
    expected = (
        "answer_from: expected a non-empty list of 'tag', 'boxed', 'last_number' (each once, tried in order), "
        f"got {value!r}"
    )
    assert check_reward_args("gym", {"answer_from": value}) == expected
    with pytest.raises(ValueError, match="^gym: answer_from: expected"):
        gym_reward.score(row("basic_arithmetic")[0], said("<answer>1</answer>"), answer_from=value)


# -- answer_from: where a model that never writes the tag puts its answer --------------------------

ALL = ["tag", "boxed", "last_number"]


async def test_each_source_finds_the_answer_and_says_which_it_was():
    score = get_reward("gym")
    sample, entry = row("letter_counting")
    gold = entry["answer"]
    for text, source in (
        (f"<answer>{gold}</answer>", "tag"),
        (f"so it is \\boxed{{{gold}}}.", "boxed"),
        (f"The letter appears {gold} times in the text.", "last_number"),
    ):
        result = await score(sample, said(text), answer_from=[source])
        assert (result.score, result.info["answer"], result.info["answer_from"]) == (1.0, gold, source), text
    assert (await score(sample, said(f"<answer>{gold}</answer>"))).info["answer_from"] == "tag"  # the default


async def test_a_source_not_listed_is_not_read():
    score = get_reward("gym")
    sample, entry = row("letter_counting")
    for text in (f"\\boxed{{{entry['answer']}}}", f"it appears {entry['answer']} times"):
        result = await score(sample, said(text))  # the default: the tag only, as reasoning-gym reads it
        assert result.score == 0.0 and result.info["reason"] == "no <answer>...</answer> block"


async def test_the_sources_are_tried_in_the_order_listed():
    score = get_reward("gym")
    sample, entry = row("letter_counting")
    gold = entry["answer"]
    text = f"<answer>{gold}</answer> or \\boxed{{{gold}7}}, or 99"
    assert (await score(sample, said(text), answer_from=ALL)).info["answer_from"] == "tag"
    boxed_first = await score(sample, said(text), answer_from=["boxed", "tag", "last_number"])
    assert (boxed_first.info["answer"], boxed_first.info["answer_from"]) == (f"{gold}7", "boxed")
    assert boxed_first.score < 1.0
    number_first = await score(sample, said(text), answer_from=["last_number", "tag"])
    assert (number_first.info["answer"], number_first.info["answer_from"]) == ("99", "last_number")
    no_tag = await score(sample, said(f"\\boxed{{{gold}}} though I counted 5"), answer_from=ALL)
    assert (no_tag.score, no_tag.info["answer_from"]) == (1.0, "boxed")


async def test_boxed_is_brace_balanced_and_read_after_the_reasoning():
    score = get_reward("gym")
    sample, _ = row("basic_arithmetic")
    nested = await score(sample, said("\\boxed{\\frac{1}{2}} done"), answer_from=["boxed"])
    assert nested.info["answer"] == "\\frac{1}{2}"
    worded = await score(sample, said("\\boxed{\\text{seven}}"), answer_from=["boxed"])
    assert worded.info["answer"] == "seven"
    unclosed = await score(sample, said("\\boxed{3"), answer_from=["boxed"])
    assert unclosed.info["reason"] == "no \\boxed{}"
    draft = await score(
        sample, said("<think>\\boxed{1} and 2</think> I am not sure"), answer_from=["boxed", "last_number"]
    )
    assert draft.score == 0.0 and draft.info["reason"] == "no \\boxed{} or number"


async def test_last_number_is_read_only_when_the_gold_answer_is_a_number(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the verifier was asked")

    sample, entry = row("spell_backward")
    assert not entry["answer"].isdigit()
    monkeypatch.setattr(gym_reward, "verifier", boom)
    result = await get_reward("gym")(sample, said("it has 9 letters"), answer_from=ALL)
    assert result.judged and result.score == 0.0
    assert result.info["reason"] == (
        "no <answer>...</answer> block or \\boxed{} (the gold answer is not a number: last_number does not apply)"
    )
    assert gym_reward.numeric("12") and gym_reward.numeric(" -3.5 ") and gym_reward.numeric(4)
    assert not gym_reward.numeric("12 apples") and not gym_reward.numeric(True) and not gym_reward.numeric(None)


async def test_no_answer_in_any_source_is_zero_with_a_reason_and_the_verifier_is_not_asked(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the verifier was asked")

    monkeypatch.setattr(gym_reward, "verifier", boom)
    sample, _ = row("letter_counting")
    result = await get_reward("gym")(sample, said("I cannot tell."), answer_from=ALL)
    assert result.judged and result.score == 0.0
    assert result.info["reason"] == "no <answer>...</answer> block or \\boxed{} or number"


async def test_a_verifier_that_raises_is_failed_whichever_source_gave_the_answer(monkeypatch):
    class Broken:
        def score_answer(self, answer, entry):
            raise RuntimeError(f"cannot read {answer}")

    monkeypatch.setattr(gym_reward, "verifier", lambda name, config: Broken())
    sample, _ = row("letter_counting")
    for text in ("<answer>3</answer>", "\\boxed{3}", "it is 3"):
        result = await safe_score(get_reward("gym"), sample, said(text), answer_from=ALL)
        assert not result.judged
        assert result.failed == "reasoning-gym letter_counting.score_answer raised RuntimeError: cannot read 3"
