"""Domains whose rows reasoning-gym generates (`[domains.NAME.gym]`, rlvr/data/gym.py): the same rows on
every load and in every process, eval rows disjoint from the training rows, composites, and the one-line
errors of `rlvr validate` (asserted verbatim)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("reasoning_gym")  # the dev extra installs it; `pip install -e '.[gym]'`

from rlvr.cli import app  # noqa: E402
from rlvr.data import gym as gym_module  # noqa: E402
from rlvr.data.base import LoadReport  # noqa: E402
from rlvr.data.gym import gym_samples  # noqa: E402
from rlvr.data.sources import load_recipe_domains  # noqa: E402
from rlvr.recipe.load import RecipeError, load_recipe  # noqa: E402
from rlvr.recipe.schema import DomainConfig  # noqa: E402
from tests.unit.recipe.helpers import one_error_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()

RECIPE = """
[experiment]
name = "t"

[model]
config = {{ hidden_size = 32 }}
dtype = "float32"

[data]
domain_interleave_probs = {{ logic = 0.5, mix = 0.5 }}

[domains.logic]
tags = ["logic"]
reward = "gym"

[domains.logic.gym]
dataset = "{dataset}"
config = {config}
size = 12
eval_size = 4

[domains.mix]
tags = ["mix"]
reward = "gym"

[domains.mix.gym]
datasets = [{{ name = "basic_arithmetic", weight = 1.0 }}, {{ name = "leg_counting", weight = 3.0 }}]
size = 40
seed = 7

[rollout]
n = 2
temperature = 0.7
"""


@pytest.fixture(autouse=True)
def _in_process(monkeypatch):
    """Make rows in this process (as with PYTHONHASHSEED=0; the generators used here do not depend on
    it), each test from scratch; `test_rows_are_the_same_in_a_process_with_another_hash_seed` runs
    the child process itself."""
    monkeypatch.setattr(gym_module, "_hash_seed_fixed", lambda: True)
    monkeypatch.setattr(gym_module, "_MADE", {})
    monkeypatch.setattr(sys, "path", list(sys.path))  # validate adds the recipe's folder for plug-ins
    monkeypatch.delenv("RLVR_PLUGIN_PATH", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def domain(**gym) -> DomainConfig:
    return DomainConfig.model_validate({"tags": ["logic"], "reward": "gym", "gym": gym})


def write(tmp: Path, *, dataset: str = "propositional_logic", config: str = "{ min_vars = 2, max_vars = 3 }") -> Path:
    path = tmp / "recipe.toml"
    path.write_text(textwrap.dedent(RECIPE).format(dataset=dataset, config=config))
    return path


def rows(samples) -> list[tuple]:
    return [(s.id, s.tag, s.messages, s.ground_truth, json.dumps(s.extra, sort_keys=True)) for s in samples]


def test_two_loads_give_the_same_rows():
    d = domain(dataset="propositional_logic", size=20, seed=3, eval_size=5)
    first = gym_samples("logic", d, evaluation=False), gym_samples("logic", d, evaluation=True)
    gym_module._MADE.clear()  # made again, not read back
    second = gym_samples("logic", d, evaluation=False), gym_samples("logic", d, evaluation=True)
    assert rows(first[0]) == rows(second[0]) and rows(first[1]) == rows(second[1])
    assert [s.id for s in first[0]][:2] == ["propositional_logic-s3-0", "propositional_logic-s3-1"]
    assert len(first[0]) == 20 and len(first[1]) == 5


def test_a_row_is_the_question_under_the_system_prompt_with_the_entry_for_the_reward():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    (sample,) = gym_samples("logic", domain(dataset="basic_arithmetic", size=1), evaluation=False)
    entry = sample.extra["gym"]["entry"]
    assert sample.messages == [
        {"role": "system", "content": SYSTEM_PROMPTS["default"]},
        {"role": "user", "content": entry["question"]},
    ]
    assert "<answer>" in sample.messages[0]["content"]
    assert sample.tag == "logic" and sample.domain == "logic" and sample.ground_truth == entry["answer"]
    assert sample.extra["gym"]["dataset"] == "basic_arithmetic" and sample.extra["gym"]["config"] == {}
    assert json.loads(json.dumps(sample.extra))["gym"]["entry"]["question"] == entry["question"]  # JSON-able


def test_the_system_prompt_is_a_name_your_text_or_none():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    def first(**gym):
        return gym_samples("logic", domain(dataset="basic_arithmetic", size=1, **gym), evaluation=False)[0].messages

    assert first(system_prompt="DeepSeekZero")[0]["content"] == SYSTEM_PROMPTS["DeepSeekZero"]
    assert first(system_prompt="Reply in <answer>x</answer>.")[0] == {
        "role": "system",
        "content": "Reply in <answer>x</answer>.",
    }
    assert [m["role"] for m in first(system_prompt="")] == ["user"]


def test_train_and_eval_rows_are_disjoint():
    """Eval rows come from other seeds and, where a small config makes a question twice, a training
    question is never an eval question: the repeats are left out and counted."""
    tiny = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}
    d = domain(dataset="basic_arithmetic", config=tiny, size=60, eval_size=40)
    assert d.gym is not None and d.gym.eval_seed == 60  # the first seed past the training rows'
    report = LoadReport()
    train = gym_samples("logic", d, evaluation=False)
    evals = gym_samples("logic", d, evaluation=True, report=report)
    questions = {s.messages[-1]["content"] for s in train}
    assert report.repeated > 0 and len(evals) + report.repeated == 40
    assert not questions & {s.messages[-1]["content"] for s in evals}
    assert not {s.id for s in train} & {s.id for s in evals}
    assert {s.tag for s in evals} == {"basic_arithmetic"}  # eval metrics per generator: eval/logic/basic_arithmetic/...


def test_a_composite_mixes_its_datasets_by_weight_each_scored_by_its_own():
    d = DomainConfig.model_validate(
        {
            "tags": ["mix"],
            "reward": "gym",
            "gym": {
                "datasets": [
                    {"name": "basic_arithmetic", "weight": 1.0, "config": {"max_terms": 3}},
                    {"name": "leg_counting", "weight": 3.0},
                ],
                "size": 200,
            },
        }
    )
    samples = gym_samples("mix", d, evaluation=False)
    made = [s.extra["gym"]["dataset"] for s in samples]
    assert 20 < made.count("basic_arithmetic") < 80 and made.count("leg_counting") == 200 - made.count(
        "basic_arithmetic"
    )
    for s in samples:
        gym = s.extra["gym"]
        assert gym["entry"]["metadata"]["source_dataset"] == gym["dataset"]
        assert gym["config"] == ({"max_terms": 3} if gym["dataset"] == "basic_arithmetic" else {})
    assert {s.tag for s in samples} == {"mix"}


def test_a_generator_that_draws_from_the_global_random_gives_the_same_rows():
    """list_functions draws from Python's global `random`; each row is made with it seeded."""
    d = domain(dataset="list_functions", size=12)
    first = rows(gym_samples("logic", d, evaluation=False))
    gym_module._MADE.clear()
    assert rows(gym_samples("logic", d, evaluation=False)) == first


def test_rows_are_the_same_in_a_process_with_another_hash_seed(monkeypatch):
    """ransom_note iterates over a set of strings, so its rows follow the hash seed of the process that
    makes them. This process has a random one: its rows come from a child started with PYTHONHASHSEED=0,
    and match those a process started with PYTHONHASHSEED=0 makes itself."""
    monkeypatch.setattr(gym_module, "_hash_seed_fixed", lambda: not sys.flags.hash_randomization)
    d = domain(dataset="ransom_note", size=6)
    here = rows(gym_samples("logic", d, evaluation=False))
    code = (
        "import json, sys; from rlvr.recipe.schema import DomainConfig; from rlvr.data.gym import gym_samples; "
        "assert not sys.flags.hash_randomization; "
        "d = DomainConfig.model_validate({'tags': ['logic'], 'reward': 'gym', "
        "'gym': {'dataset': 'ransom_note', 'size': 6}}); "
        "print(json.dumps([(s.id, s.tag, s.messages, s.ground_truth, json.dumps(s.extra, sort_keys=True)) "
        "for s in gym_samples('logic', d, evaluation=False)]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert [tuple(row) for row in json.loads(out.stdout)] == here


def test_the_recipe_loads_gym_domains_with_their_eval_rows(tmp_path: Path):
    recipe = load_recipe(write(tmp_path))
    train, reports = load_recipe_domains(recipe)
    evals, _ = load_recipe_domains(recipe, eval_files=True)
    assert len(train["logic"]) == 12 and len(train["mix"]) == 40 and reports["mix"].loaded == 40
    assert len(evals["logic"]) == 4 and evals["mix"] == []
    assert recipe.domains["logic"].files == [] and recipe.domains["logic"].gym is not None


# -- rlvr validate: one line, the key, the fix -----------------------------------------------------
def error(tmp_path: Path, *args: str, **fields: str) -> str:
    path = write(tmp_path, **fields)
    line = one_error_line(runner.invoke(app, ["validate", str(path), *args]))
    return line.replace(str(path), "recipe.toml")


def test_validate_accepts_the_gym_recipe(tmp_path: Path):
    result = runner.invoke(app, ["validate", str(write(tmp_path))])
    assert result.exit_code == 0, result.output


def test_validate_warns_when_eval_rows_repeat_training_questions(tmp_path: Path):
    tiny = "{ min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1, operators = ['+'] }"
    path = write(tmp_path, dataset="basic_arithmetic", config=tiny)
    result = runner.invoke(app, ["validate", str(path), "--set", "domains.logic.gym.size=300"])
    assert result.exit_code == 0, result.output
    repeated = [line for line in result.stderr.splitlines() if "repeat" in line]
    assert len(repeated) == 1 and repeated[0].startswith("warning: domains.logic.gym: ")
    assert repeated[0].endswith(" of 4 eval rows repeat a training question; they are left out")


def test_an_unknown_dataset_names_close_ones(tmp_path: Path):
    assert error(tmp_path, dataset="propositional_logc") == (
        "error: recipe.toml:17: domains.logic.gym.dataset: unknown reasoning-gym dataset 'propositional_logc'; "
        "did you mean 'propositional_logic'?"
    )
    assert error(tmp_path, dataset="zzzz") == (
        "error: recipe.toml:17: domains.logic.gym.dataset: unknown reasoning-gym dataset 'zzzz'; list them with "
        "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'"
    )


def test_a_config_key_the_generator_does_not_take_is_named(tmp_path: Path):
    assert error(tmp_path, config="{ min_var = 2 }") == (
        "error: recipe.toml:18: domains.logic.gym.config.min_var: propositional_logic has no config key 'min_var' "
        "(did you mean 'min_vars'?); it takes max_complexity, max_statements, max_vars, min_complexity, "
        "min_statements, min_vars"
    )


def test_a_config_the_generator_rejects_says_why(tmp_path: Path):
    assert error(tmp_path, config="{ min_vars = 5, max_vars = 2 }") == (
        "error: recipe.toml:18: domains.logic.gym.config: propositional_logic rejects this config: "
        "max_vars must be >= min_vars"
    )


def test_a_composite_dataset_name_is_checked_too(tmp_path: Path):
    assert error(tmp_path, "--set", 'domains.mix.gym.datasets=[{name = "leg_countin"}]') == (
        "error: --set domains.mix.gym.datasets: domains.mix.gym.datasets.0.name: unknown reasoning-gym dataset "
        "'leg_countin'; did you mean 'leg_counting', 'letter_counting' or 'rectangle_count'?"
    )


def test_an_unknown_system_prompt(tmp_path: Path):
    assert error(tmp_path, "--set", "domains.logic.gym.system_prompt=defualt") == (
        "error: --set domains.logic.gym.system_prompt: 'defualt' is neither a reasoning-gym system prompt "
        "(DeepSeekZero, default, simple, direct, chain_of_draft) nor a prompt that asks for <answer>...</answer>; "
        'write one of those names, your own text with <answer>, or "" for none'
    )


def test_reasoning_gym_not_installed(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    assert error(tmp_path) == (
        "error: recipe.toml:16: domains.logic.gym: reasoning-gym is not installed: pip install -e '.[gym]'"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            'domains.logic.files=["x.jsonl"]',
            "recipe.toml:16: domains.logic.gym: a domain reads files or generates its rows with gym, not both: "
            "remove one of them",
        ),
        (
            "domains.logic.gym.datasets=[{name = 'maze'}]",
            "recipe.toml:17: domains.logic.gym.dataset: set exactly one of dataset (one generator) or datasets "
            "(several, mixed by weight)",
        ),
        (
            "domains.logic.gym.config={seed = 3}",
            "--set domains.logic.gym.config: domains.logic.gym.config.seed: seed is the gym table's own key: "
            "write seed = ... beside dataset",
        ),
        ("domains.logic.gym.sise=3", "--set domains.logic.gym.sise: unknown key; did you mean 'size'?"),
        (
            "domains.logic.gym.eval_seed=10",
            "--set domains.logic.gym.eval_seed: eval rows from seeds 10..13 would repeat training rows (seeds "
            "0..11): use eval_seed >= 12, or leave it unset",
        ),
    ],
)
def test_the_recipe_refuses_a_gym_table_that_cannot_work(tmp_path: Path, override: str, message: str):
    path = write(tmp_path)
    with pytest.raises(RecipeError) as caught:
        load_recipe(path, [override])
    assert str(caught.value).replace(str(path), "recipe.toml") == message


def test_a_domain_without_files_or_gym(tmp_path: Path):
    path = tmp_path / "recipe.toml"
    path.write_text('[model]\nconfig = { hidden_size = 32 }\n\n[domains.logic]\ntags = ["logic"]\nreward = "gym"\n')
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert str(caught.value).replace(str(path), "recipe.toml") == (
        "recipe.toml:4: domains.logic.files: required: data files, or a gym table (reasoning-gym) or verifiers "
        "table (a taskset) that makes the rows"
    )


def test_plan_shows_each_generator_its_config_and_seeds(tmp_path: Path):
    result = runner.invoke(
        app, ["plan", str(write(tmp_path)), "--out", str(tmp_path / "r.json")], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.replace("│", " ").split()) for line in result.output.splitlines()]
    assert "logic propositional_logic - { min_vars = 2, max_vars = 3 } 12 from seed 0 4 from seed 12 default" in lines
    assert "mix basic_arithmetic 0.25 (defaults) 40 from seed 7 - default" in lines
    assert "leg_counting 0.75 (defaults)" in lines
    resolved = json.loads((tmp_path / "r.json").read_text())
    assert resolved["domains"]["logic"]["gym"]["eval_seed"] == 12  # resolved: a resume sees the same eval rows
