"""The tools quickstart (recipes/tools.toml): its shipped data is what the generator writes, the
warm-up's tool answers are exactly what the recipe's real tools answer, right answers score 1
and guesses 0 under the recipe's rewards, and the recipe validates with tools on and off."""

from __future__ import annotations

import filecmp
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.data.sources import load_domain_samples
from rlvr.quickstart.tool_tasks import fact_call, guess, math_answer, math_call, write_tools_data
from rlvr.quickstart.tools_pretrain import SEARCH_TOP_K, tool_episode
from rlvr.recipe.load import load_recipe
from rlvr.rewards.registry import get_reward
from rlvr.tools.search import SearchIndex
from rlvr.tools.session import Toolbox
from rlvr.types import Completion

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "tools.toml"
DATA = ROOT / "recipes" / "tools" / "data"
TOOLS_OFF = ["--set", "domains.math.tools=[]", "--set", "domains.facts.tools=[]"]


def test_shipped_data_is_what_the_generator_writes(tmp_path: Path) -> None:
    write_tools_data(tmp_path)
    names = sorted(p.name for p in DATA.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    assert filecmp.cmpfiles(DATA, tmp_path, names, shallow=False)[0] == names


@pytest.fixture(scope="module")
def recipe():
    return load_recipe(RECIPE)


@pytest.fixture(scope="module")
def samples(recipe) -> dict:
    return {
        name: load_domain_samples(d.files, domain=name, tags=d.tags, reward=d.reward)[:3]
        for name, d in recipe.domains.items()
    }


@pytest.mark.parametrize("domain", ["math", "facts"])
async def test_warmup_tool_answers_are_the_real_tools_answers(recipe, samples, tokenizer, domain: str) -> None:
    d = recipe.domains[domain]
    assert domain == "math" or d.search_top_k == SEARCH_TOP_K
    box = Toolbox.for_domain(d, tokenizer=tokenizer, default_tokens=recipe.rollout.max_new_tokens)
    index = SearchIndex(DATA / "corpus.jsonl")
    for sample in samples[domain]:
        row = {"prompt": sample.messages[-1]["content"], "ground_truth": sample.ground_truth, **sample.extra}
        (call, trained), (answer, masked), _ = tool_episode(domain, row, search=index.search)
        reply = await box.session().respond(call)
        assert reply is not None and reply.text == answer, (call, reply)
        assert trained and not masked
        assert str(sample.ground_truth) in answer  # the tool knows what the model cannot


@pytest.mark.parametrize("domain", ["math", "facts"])
async def test_copied_answers_score_one_and_math_guesses_zero(recipe, samples, domain: str) -> None:
    d = recipe.domains[domain]
    score = get_reward(d.reward)
    index = SearchIndex(DATA / "corpus.jsonl")
    rng = random.Random(0)
    for sample in samples[domain]:
        row = {"prompt": sample.messages[-1]["content"], "ground_truth": sample.ground_truth, **sample.extra}
        episode = "".join(text for text, _ in tool_episode(domain, row, search=index.search))
        called = await score(sample, Completion(text=episode, token_ids=[], logprobs=[]), **d.reward_args)
        assert called.score == 1.0, (episode, called.info)
        stopped = math_call(row) if domain == "math" else fact_call(row)
        no_answer = "".join(text for text, _ in tool_episode(domain, row, search=index.search)[:2])
        unanswered = await score(sample, Completion(text=no_answer, token_ids=[], logprobs=[]), **d.reward_args)
        assert unanswered.score == 0.0, stopped  # the <result> itself is never taken as the answer
        if domain == "math":
            wrong = await score(sample, Completion(text=guess(domain, row, rng), token_ids=[], logprobs=[]))
            assert wrong.score == 0.0
    assert math_answer("7") == "\\boxed{7}"


def test_the_tools_off_prompt_is_the_same_prompt(recipe, tokenizer) -> None:
    box = Toolbox.for_domain(recipe.domains["facts"], tokenizer=tokenizer, default_tokens=8)
    messages = [{"role": "user", "content": "where is kavomi?"}]
    assert not recipe.domains["facts"].tool_instructions and box.prompt_messages(messages) == messages


@pytest.mark.parametrize(
    ("extra", "code"),
    [([], 0), (TOOLS_OFF, 0), (["--set", 'domains.math.tool_instructions="sometimes"'], 2)],
)
def test_recipe_validates_with_tools_on_and_off(extra: list[str], code: int) -> None:
    result = CliRunner().invoke(app, ["validate", str(RECIPE), *extra])
    assert result.exit_code == code, result.output
    if code:
        assert "tool_instructions" in result.output and "Traceback" not in result.output
