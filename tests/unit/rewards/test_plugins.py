"""Plug-in rewards before a run starts: beside the recipe they import (in validate, in `rewards
check` and in the processes a launch starts); a signature that cannot take the recipe's
reward_args, or the (sample, completion) call, is one line and exit 2 (issue 23)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.plugins import PLUGIN_PATH_ENV
from rlvr.rewards.registry import check_reward_args, check_reward_name
from tests.unit.recipe.helpers import one_error_line

runner = CliRunner()

PLUGIN = """
from rlvr.types import RewardResult


def score(sample, completion, threshold=0.5, scale=1.0):
    return RewardResult(float(len(completion.text) >= threshold) * scale, {"reason": "length"})


def any_args(sample, completion, **kwargs):
    return 1.0


def needs_level(sample, completion, *, level):
    return 1.0


def one_arg(completion):
    return 1.0


async def async_score(sample, completion, /, cutoff=1):
    return 1.0


class Scorer:
    def score(self, sample, completion, strict=False):
        return 1.0


class NeedsInit:
    def __init__(self, model_path):
        self.model_path = model_path

    def score(self, sample, completion):
        return 1.0


def raises(sample, completion):
    raise RuntimeError("reward backend unavailable")


def returns_text(sample, completion):
    return "yes"
"""

RECIPE = """
[experiment]
name = "t"

[model]
config = {{ hidden_size = 32 }}

[domains.mine]
tags = ["mine"]
files = ["rows.jsonl"]
reward = "{reward}"
reward_args = {args}

[rollout]
n = 2
temperature = 0.7
"""


@pytest.fixture(autouse=True)
def _isolated_plugin_path(monkeypatch):
    """Each test starts without plug-in folders and forgets what it imported and added."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(PLUGIN_PATH_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    yield
    for name in ("my_reward", "broken_reward"):
        sys.modules.pop(name, None)


def write_recipe(folder: Path, reward: str = "my_reward:score", args: str = "{}") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_reward.py").write_text(PLUGIN)
    row = {"id": "r1", "tag": "mine", "prompt": "say something", "completion": "hello"}
    (folder / "rows.jsonl").write_text(json.dumps(row) + "\n")
    path = folder / "recipe.toml"
    path.write_text(textwrap.dedent(RECIPE).format(reward=reward, args=args))
    return path


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", PLUGIN_PATH_ENV)}


# -- the recipe's folder ---------------------------------------------------------------------


def test_plugin_beside_the_recipe_validates(tmp_path: Path) -> None:
    path = write_recipe(tmp_path / "recipes")
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert os.environ[PLUGIN_PATH_ENV] == str((tmp_path / "recipes").resolve())


def test_the_processes_a_launch_starts_import_it_too(tmp_path: Path) -> None:
    """`launch` validates (which adds the folder) before it starts the trainer, which inherits it."""
    path = write_recipe(tmp_path / "recipes")
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import asyncio\n"
        "from rlvr.rewards.registry import get_reward\n"
        "from rlvr.types import Completion, Sample\n"
        "fn = get_reward('my_reward:score')\n"
        "sample = Sample(id='a', tag='mine', messages=[{'role': 'user', 'content': 'q'}])\n"
        "print(asyncio.run(fn(sample, Completion(text='hello', token_ids=[], logprobs=[]))).score)\n"
    )
    env = {**clean_env(), PLUGIN_PATH_ENV: os.environ[PLUGIN_PATH_ENV]}
    proc = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1.0"


def test_rewards_check_imports_the_plugin_beside_the_recipe(tmp_path: Path) -> None:
    path = write_recipe(tmp_path / "recipes")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    command = [sys.executable, "-m", "rlvr.cli", "rewards", "check", str(path.parent / "rows.jsonl")]
    proc = subprocess.run(
        [*command, "--recipe", str(path)], cwd=elsewhere, env=clean_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 rows, mean score 1.000, 1 at 1.0, 0 failed" in proc.stdout


def test_a_plugin_that_is_nowhere_names_the_folders_searched(tmp_path: Path) -> None:
    path = write_recipe(tmp_path / "recipes", reward="no_such_reward:score")
    folder = path.parent.resolve()
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "validate", str(path)],
        cwd=folder,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"error: {path}:11: domains.mine.reward: plug-in 'no_such_reward:score': cannot import module "
        f"'no_such_reward': no 'no_such_reward' in {folder} or the installed packages (plug-ins are imported "
        "from the recipe's folder, PYTHONPATH and the installed packages)"
    )


def test_a_plugin_whose_own_import_fails_says_so(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "broken_reward.py").write_text(
        "import numpyy_not_here\n\ndef score(sample, completion):\n    return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check_reward_name("broken_reward:score") == (
        "plug-in 'broken_reward:score': importing module 'broken_reward' failed: No module named 'numpyy_not_here'"
    )
    sys.modules.pop("broken_reward", None)
    (tmp_path / "broken_reward.py").write_text("def score(sample, completion)\n    return 1\n")
    problem = check_reward_name("broken_reward:score") or ""
    assert problem.startswith("plug-in 'broken_reward:score': importing module 'broken_reward' failed: SyntaxError:")


# -- the signature ---------------------------------------------------------------------------


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch) -> str:
    (tmp_path / "my_reward.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_reward"


@pytest.mark.parametrize(
    ("attr", "args"),
    [
        ("score", {}),
        ("score", {"threshold": 3, "scale": 2.0}),
        ("any_args", {"whatever": 1}),
        ("needs_level", {"level": 2}),
        ("async_score", {"cutoff": 2}),
        ("Scorer", {"strict": True}),
    ],
)
def test_reward_args_the_plugin_takes(plugin: str, attr: str, args: dict) -> None:
    assert check_reward_name(f"{plugin}:{attr}") is None
    assert check_reward_args(f"{plugin}:{attr}", args) is None


@pytest.mark.parametrize(
    ("attr", "args", "message"),
    [
        (
            "score",
            {"treshold": 3},
            "my_reward:score does not take 'treshold' (did you mean 'threshold'?); it takes scale, threshold",
        ),
        ("Scorer", {"strict": True, "lenient": 1}, "my_reward:Scorer does not take 'lenient'; it takes strict"),
        ("raises", {"scale": 1}, "my_reward:raises does not take 'scale'; it takes no reward_args"),
        ("needs_level", {}, "my_reward:needs_level needs reward_args 'level' (no default in its signature)"),
        (
            "any_args",
            {"sample": 1},
            "my_reward:any_args does not take 'sample': it is the name of its sample or completion argument",
        ),
    ],
)
def test_reward_args_the_plugin_does_not_take(plugin: str, attr: str, args: dict, message: str) -> None:
    assert check_reward_args(f"{plugin}:{attr}", args) == message


def test_a_plugin_must_take_sample_and_completion(plugin: str) -> None:
    assert check_reward_name(f"{plugin}:one_arg") == (
        "plug-in 'my_reward:one_arg' must take (sample, completion) as its first two arguments; "
        "its signature is (completion)"
    )
    assert check_reward_name(f"{plugin}:NeedsInit") == (
        "plug-in 'my_reward:NeedsInit' is a class whose __init__ needs model_path; rlvr creates it with no arguments"
    )


def test_validate_refuses_a_mistyped_plugin_argument(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, args="{ treshold = 3 }")
    line = one_error_line(runner.invoke(app, ["validate", str(path)]))
    assert line == (
        f"error: {path}:12: domains.mine.reward_args: my_reward:score does not take 'treshold' "
        "(did you mean 'threshold'?); it takes scale, threshold"
    )


def test_validate_refuses_a_plugin_without_the_call_arguments(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, reward="my_reward:one_arg")
    line = one_error_line(runner.invoke(app, ["validate", str(path)]))
    assert line == (
        f"error: {path}:11: domains.mine.reward: plug-in 'my_reward:one_arg' must take (sample, completion) "
        "as its first two arguments; its signature is (completion)"
    )
