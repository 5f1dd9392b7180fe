"""Verifiers (v1) tasksets as domains (`[domains.NAME.verifiers]`, rlvr/rewards/verifiers_env.py and
rlvr/data/verifiers_rows.py): a task's system prompt and prompt become the row, its own rewards the
verdict (named rewards and metrics logged as `reward/<domain>/sub/<name>`), a score that raises could
not judge, multi-turn tasksets are refused, and `rlvr validate`'s one-line errors (asserted verbatim)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("verifiers.v1")  # the dev extra installs it; `pip install -e '.[verifiers]'`

from rlvr.cli import app  # noqa: E402
from rlvr.data.base import DataError  # noqa: E402
from rlvr.data.sources import load_recipe_domains  # noqa: E402
from rlvr.recipe.load import load_recipe  # noqa: E402
from rlvr.rewards import verifiers_env  # noqa: E402
from rlvr.rewards.pool import DomainReward, RewardPool  # noqa: E402
from rlvr.rewards.registry import get_reward  # noqa: E402
from rlvr.types import Completion, Group  # noqa: E402
from tests.unit.recipe.helpers import one_error_line  # noqa: E402
from tests.unit.rewards.verifiers_tasksets import MODULES, write_recipe  # noqa: E402

runner = CliRunner()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Each test imports the tasksets from its own folder: no module or taskset left from another."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # validate adds the recipe's folder for plug-ins
    monkeypatch.delenv("RLVR_PLUGIN_PATH", raising=False)
    for name in MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    verifiers_env._loaded.cache_clear()
    yield
    for name in MODULES:
        sys.modules.pop(name, None)
    verifiers_env._loaded.cache_clear()


def said(text: str) -> Completion:
    return Completion(text=text, token_ids=[], logprobs=[])


def loaded(tmp_path: Path, *sets: str):
    recipe = load_recipe(write_recipe(tmp_path), list(sets))
    from rlvr.plugins import add_plugin_dir

    add_plugin_dir(tmp_path)  # what validate and launch do for the recipe's folder
    return recipe


def test_each_task_is_a_row_under_its_system_prompt_and_the_eval_args_give_the_eval_rows(tmp_path: Path):
    recipe = loaded(tmp_path)
    train, reports = load_recipe_domains(recipe)
    evals, _ = load_recipe_domains(recipe, eval_files=True)
    assert len(train["sums"]) == 6 and reports["sums"].loaded == 6 and len(evals["sums"]) == 3
    first = train["sums"][1]
    assert (first.id, first.tag, first.domain) == ("sums-train-1", "sums", "sums")
    assert first.messages == [
        {"role": "system", "content": "Put the answer in \\boxed{}."},
        {"role": "user", "content": "What is 1 + 1?"},
    ]
    assert first.extra["verifiers"]["data"]["answer"] == "2"
    assert evals["sums"][0].messages[-1]["content"] == "What is 2 + 0?"  # the test split: tasks 100..102


def test_size_takes_the_first_tasks_and_no_eval_args_means_no_eval_rows(tmp_path: Path):
    recipe = loaded(tmp_path, "domains.sums.verifiers.size=2")
    recipe.domains["sums"].verifiers.eval_args = None  # the key left out (--set cannot write a null)
    train, _ = load_recipe_domains(recipe)
    evals, _ = load_recipe_domains(recipe, eval_files=True)
    assert [s.id for s in train["sums"]] == ["sums-train-0", "sums-train-1"] and evals["sums"] == []


def test_the_configs_system_prompt_file_replaces_the_tasks_as_verifiers_iteration_does(tmp_path: Path):
    (tmp_path / "prompt.txt").write_text("Think, then box the sum.")
    recipe = loaded(
        tmp_path, f"domains.sums.verifiers.args={{n = 2, system_prompt = {str(tmp_path / 'prompt.txt')!r}}}"
    )
    rows = load_recipe_domains(recipe)[0]["sums"]
    assert [s.messages[0]["content"] for s in rows] == ["Think, then box the sum."] * 2
    assert [s.extra["verifiers"]["data"]["idx"] for s in rows] == [0, 1]


async def test_the_verdict_is_the_tasks_own_rewards_with_each_reward_and_metric_named(tmp_path: Path):
    recipe = loaded(tmp_path)
    train, _ = load_recipe_domains(recipe)
    sample = train["sums"][3]  # 3 + 3
    score = get_reward("verifiers")
    right = await score(sample, said("Adding: \\boxed{6}"))
    wrong = await score(sample, said("\\boxed{7}"))
    assert right.score == 1.0 and right.judged
    assert right.info["subscores"] == {"correct": 1.0, "chars": float(len("Adding: \\boxed{6}"))}
    assert wrong.score == 0.0 and wrong.judged
    assert wrong.info["reason"] == "SumTask's rewards gave 0 (correct)"


async def test_a_score_that_raises_could_not_judge_and_the_pool_logs_the_named_scores(tmp_path: Path):
    recipe = loaded(tmp_path, "domains.sums.verifiers.args={n = 2, explode = true}")
    bad = load_recipe_domains(recipe)[0]["sums"][0]
    verifiers_env._loaded.cache_clear()
    good = load_recipe_domains(loaded(tmp_path))[0]["sums"][1]
    result = await get_reward("verifiers")(bad, said("\\boxed{0}"))
    assert not result.judged and result.info["error"] is True
    assert result.failed == "SumTask.score raised RuntimeError: the checker is down"
    pool = RewardPool({"sums": DomainReward("verifiers", get_reward("verifiers"))})
    groups = [Group(sample=bad, completions=[said("\\boxed{0}")]), Group(good, [said("\\boxed{2}"), said("no")])]
    metrics = await pool.score_groups(groups)
    assert (metrics["reward/sums/count"], metrics["reward/sums/failed"], metrics["reward/sums/mean"]) == (2, 1, 0.5)
    assert metrics["reward/sums/sub/correct"] == 0.5 and metrics["reward/sums/sub/chars"] == (9 + 2) / 2


def test_a_task_the_user_opens_is_refused_when_the_rows_load(tmp_path: Path):
    recipe = loaded(tmp_path, 'domains.sums.verifiers.taskset="toy_user_opens"', "domains.sums.verifiers.args={}")
    recipe.domains["sums"].verifiers.eval_args = None
    with pytest.raises(DataError) as caught:
        load_recipe_domains(recipe)
    assert str(caught.value) == (
        "domains.sums.verifiers.taskset: task 0 of OpenTaskset has no prompt (the user opens the conversation: "
        "multi-turn); rlvr runs single-turn verifiers tasksets only"
    )


# -- rlvr validate: one line, the key, the fix -----------------------------------------------------
def error(tmp_path: Path, *sets: str) -> str:
    path = write_recipe(tmp_path)
    args = [x for s in sets for x in ("--set", s)]
    return one_error_line(runner.invoke(app, ["validate", str(path), *args])).replace(str(tmp_path), "TMP")


def test_validate_accepts_the_verifiers_recipe(tmp_path: Path):
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path))])
    assert result.exit_code == 0, result.output


def test_a_taskset_that_is_not_there(tmp_path: Path):
    assert error(tmp_path, 'domains.sums.verifiers.taskset="toy_sumz"') == (
        "error: --set domains.sums.verifiers.taskset: no verifiers taskset 'toy_sumz': module 'toy_sumz' is not in "
        "the recipe's folder, PYTHONPATH or the installed packages; install the environment (pip install toy-sumz, "
        "or prime env install OWNER/toy_sumz) or put toy_sumz.py beside the recipe"
    )


def test_verifiers_not_installed(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)  # `import verifiers.v1` raises ImportError
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    assert error(tmp_path) == (
        "error: TMP/recipe.toml:13: domains.sums.verifiers: verifiers is not installed: pip install -e '.[verifiers]'"
    )


def test_a_config_key_the_taskset_does_not_take(tmp_path: Path):
    assert error(tmp_path, "domains.sums.verifiers.args={m = 3}") == (
        "error: --set domains.sums.verifiers.args: domains.sums.verifiers.args.m: SumsTaskset: Extra inputs are not "
        "permitted; SumsTaskset takes explode, n, split"
    )


def test_a_config_value_the_taskset_rejects(tmp_path: Path):
    assert error(tmp_path, 'domains.sums.verifiers.eval_args={n = "three"}') == (
        "error: --set domains.sums.verifiers.eval_args: domains.sums.verifiers.eval_args.n: SumsTaskset: Input should "
        "be a valid integer, unable to parse string as an integer (got 'three')"
    )


@pytest.mark.parametrize(
    ("taskset", "why"),
    [
        ("toy_chat", "ChatTaskset is multi-turn (it brings its own environment (ChatEnv: several agents or turns))"),
        ("toy_setup", "BoxTaskset is multi-turn (its tasks set up a runtime)"),
        ("toy_graded_in_box", "FileTaskset is multi-turn (its rewards read a runtime: tests_pass)"),
    ],
)
def test_a_multi_turn_taskset_is_refused(tmp_path: Path, taskset: str, why: str):
    assert error(tmp_path, f'domains.sums.verifiers.taskset="{taskset}"', "domains.sums.verifiers.args={}") == (
        f"error: --set domains.sums.verifiers.taskset: {why}; rlvr runs single-turn verifiers tasksets only "
        "(one prompt, one reply)"
    )


def test_a_verifiers_domain_is_scored_by_its_taskset(tmp_path: Path):
    assert error(tmp_path, 'domains.sums.reward="math_rule"') == (
        'error: --set domains.sums.reward: a verifiers domain is scored by its taskset: write reward = "verifiers"'
    )
    assert error(tmp_path, "domains.sums.reward_args={strict = true}") == (
        "error: --set domains.sums.reward_args: verifiers does not take 'strict'; it takes max_workers, timeout_s"
    )
