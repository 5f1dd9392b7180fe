"""Every shipped recipe validates; overrides apply; bad input gives one line, exit 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.recipe.load import RecipeError, load_recipe

from .helpers import MATH_ROWS, MINIMAL, write_recipe

ROOT = Path(__file__).resolve().parents[3]
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))
runner = CliRunner()


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_validates(recipe: Path) -> None:
    result = runner.invoke(app, ["validate", str(recipe)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.stdout


def test_flagship_is_multi_task_grpo_on_slurm() -> None:
    recipe = load_recipe(ROOT / "recipes" / "math_code_judge.toml")
    assert recipe.data.domain_interleave_probs == {"math": 0.6, "code": 0.3, "general": 0.1}
    assert {d.reward for d in recipe.domains.values()} == {"math_rule", "code_sandbox", "llm_judge"}
    assert recipe.algorithm.preset == "grpo" and recipe.cluster.kind == "slurm" and recipe.cluster.nodes >= 2


def test_overrides_parse_toml_values_and_strings(tmp_path: Path) -> None:
    path = write_recipe(tmp_path)
    recipe = load_recipe(
        path, ["rollout.n=16", "algorithm.preset=dapo", "experiment.name=run-7", 'rollout.stop=["\\n\\n"]']
    )
    assert recipe.rollout.n == 16
    assert recipe.experiment.name == "run-7"
    assert recipe.rollout.stop == ["\n\n"]
    assert recipe.algorithm.dynamic_sampling is True and recipe.algorithm.clip_ratio_high == 0.28


def test_recipe_knob_beats_preset(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path), ["algorithm.preset=gspo", "algorithm.clip_ratio_high=0.001"])
    assert recipe.algorithm.importance_level == "sequence"
    assert recipe.algorithm.clip_ratio_high == 0.001


def test_data_paths_resolve_relative_to_the_recipe(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path))
    assert recipe.domains["math"].files == [str((tmp_path / "math.jsonl").resolve())]


BAD_CASES = {
    "async without an importance cap": (
        MINIMAL.replace("n = 2", "n = 2\nmax_staleness = 1"),
        "recipe.toml:25: rollout.max_staleness: asynchronous rollout trains on older weights' samples: set "
        "algorithm.tis_cap",
    ),
    "staleness in its old table": (
        MINIMAL + "\n[sync]\nmax_staleness = 1\n",
        "sync: max_staleness moved: set rollout.max_staleness instead",
    ),
    "unknown key": (
        MINIMAL.replace("temperature = 0.7", "temprature = 0.7"),
        "recipe.toml:25: rollout.temprature: unknown key; did you mean 'temperature'?",
    ),
    "wrong type": (
        MINIMAL.replace("n = 2", 'n = "many"'),
        "recipe.toml:24: rollout.n: Input should be a valid integer",
    ),
    "probs sum": (
        MINIMAL.replace("code = 0.25", "code = 0.5"),
        "recipe.toml:11: data.domain_interleave_probs: values must sum to 1, got 1.25",
    ),
    "probs unknown domain": (
        MINIMAL.replace("code = 0.25", "cod = 0.25"),
        "data.domain_interleave_probs: missing domains ['code']",
    ),
    "missing data file": (
        MINIMAL.replace('files = ["{code}"]', 'files = ["nope.jsonl"]'),
        "recipe.toml:20: domains.code.files: no such data file 'nope.jsonl'",
    ),
    "gae without critic": (
        MINIMAL + '\n[algorithm]\nadvantage = "gae"\n',
        "algorithm: advantage = 'gae' needs critic = true",
    ),
    "unknown preset": (
        MINIMAL + '\n[algorithm]\npreset = "grpoo"\n',
        "recipe.toml:28: algorithm.preset: unknown preset 'grpoo'",
    ),
    "missing model": (MINIMAL.replace("config = {{ hidden_size = 32 }}", ""), "model: set exactly one of model.path"),
    "invalid toml": (MINIMAL + "\n[rollout\n", "invalid TOML"),
    "tag owned twice": (
        MINIMAL.replace('tags = ["code"]', 'tags = ["math"]'),
        "domains.code.tags: tag 'math' is already owned by domain 'math'",
    ),
    "reward arg typo": (
        MINIMAL.replace('reward = "math_rule"', 'reward = "math_rule"\nreward_args = {{ timout_s = 3 }}'),
        "recipe.toml:17: domains.math.reward_args: math_rule does not take 'timout_s' (did you mean 'timeout_s'?)",
    ),
    "unknown reward": (
        MINIMAL.replace('reward = "math_rule"', 'reward = "math_rules"'),
        "recipe.toml:16: domains.math.reward: unknown reward 'math_rules'",
    ),
    "in-process sync on a launched run": (
        MINIMAL + '\n[sync]\nmethod = "inprocess"\n',
        "sync.method: inprocess needs the embedded engine inside the trainer process",
    ),
    "slurm split": (
        MINIMAL + '\n[cluster]\nkind = "slurm"\nnodes = 1\n',
        "cluster: trainer_nodes (1) must be less than nodes (1)",
    ),
}


@pytest.mark.parametrize("case", BAD_CASES, ids=list(BAD_CASES))
def test_bad_recipe_gives_one_clear_line_and_exit_2(tmp_path: Path, case: str) -> None:
    body, expected = BAD_CASES[case]
    path = write_recipe(tmp_path, body)
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert expected in message, message
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_json_row_names_file_and_line(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, math_rows=[MATH_ROWS[0], '{"id": "m2", "tag": "math", "prompt": ', MATH_ROWS[1]])
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert f"{tmp_path / 'math.jsonl'}:2: invalid JSON" in " ".join(result.stderr.split())


def test_bad_row_fields_name_the_reason(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, math_rows=[MATH_ROWS[0], '{"id": "m2", "tag": "math", "prompt": "x"}'])
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "math.jsonl:2: math_rule rows need 'ground_truth'" in " ".join(result.stderr.split())


def test_skip_mode_counts_bad_rows_instead(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, math_rows=[MATH_ROWS[0], "not json", MATH_ROWS[1]])
    result = runner.invoke(app, ["plan", str(path), "--set", "data.on_bad_row=skip", "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    resolved = json.loads((tmp_path / "r.json").read_text())
    assert resolved["data"]["on_bad_row"] == "skip"


def test_bad_override_syntax(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path)), "--set", "rollout.n"])
    assert result.exit_code == 2
    assert "expected KEY.PATH=VALUE" in result.stderr


def test_missing_recipe_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path / "none.toml")])
    assert result.exit_code == 2
    assert "no such recipe file" in result.stderr


def test_plan_writes_resolved_json_with_every_knob(tmp_path: Path) -> None:
    out = tmp_path / "resolved.json"
    result = runner.invoke(app, ["plan", str(ROOT / "recipes" / "math_code_judge.toml"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    resolved = json.loads(out.read_text())
    assert resolved["algorithm"]["kl_estimator"] == "k3"
    assert resolved["algorithm"]["clip_ratio_high"] == 0.28
    assert "8 rank(s)" in result.stdout and "rollout 7 (sglang)" in result.stdout
    # The resolved JSON is a complete recipe: it loads back to the same thing.
    from rlvr.recipe.load import recipe_from_json

    assert recipe_from_json(out.read_text()).model_dump(mode="json") == resolved


def test_cli_is_fast_and_torch_free() -> None:
    """`rlvr validate` and `--help` must not import torch (they run on login nodes)."""
    code = (
        "import sys; from rlvr.cli import app; "
        "sys.argv=['rlvr', 'validate', 'recipes/math_code_judge.toml'];\n"
        "try:\n    app()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, timeout=60)


def test_real_process_exit_code_and_no_traceback(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, MINIMAL.replace("n = 2", "n = -3"))
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "rollout.n" in proc.stderr and "Traceback" not in proc.stderr


def test_load_recipe_raises_recipe_error_not_validation_error(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="rollout.top_p"):
        load_recipe(write_recipe(tmp_path, MINIMAL.replace("n = 2", "top_p = 2.0")))
