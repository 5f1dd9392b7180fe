"""qa_match: SQuAD/HotpotQA normalisation, aliases, token F1, the <answer> block and the format term."""

from __future__ import annotations

import pytest

from rlvr.rewards.registry import check_reward_args, get_reward
from rlvr.types import Completion, Sample


async def _score(text: str, truth, **args):
    sample = Sample(id="1", tag="qa", messages=[], ground_truth=truth)
    return await get_reward("qa_match")(sample, Completion(text=text, token_ids=[], logprobs=[]), **args)


@pytest.mark.parametrize(
    ("text", "truth", "em"),
    [
        ("<answer>The Eiffel Tower!</answer>", "eiffel tower", 1.0),
        ("<search>x</search>\n<result>Paris</result>\n<answer>Paris</answer>", ["City of Light", "paris"], 1.0),
        ("I think\nParis, France", "Paris", 0.0),
        ("<think>maybe Rome</think>\nRome", {"target": ["rome"]}, 1.0),
    ],
)
async def test_exact_match_after_normalisation(text, truth, em):
    assert (await _score(text, truth)).score == em


async def test_f1_metric_and_format_weight():
    result = await _score("Paris, France", "Paris", metric="f1")
    assert result.score == pytest.approx(2 / 3) and result.info["em"] == 0.0
    tagged = await _score("<answer>Rome</answer>", "Paris", format_weight=0.2)
    assert tagged.score == pytest.approx(0.2)
    assert (await _score("<answer>Paris</answer>", "Paris", format_weight=0.2)).score == pytest.approx(1.0)


async def test_bad_input_scores_zero_with_a_reason():
    assert (await _score("", "x")).info["reason"] == "no answer"
    assert "ground_truth" in (await _score("x", 42)).info["reason"]
    assert check_reward_args("qa_match", {"metrc": "em"}) is not None
