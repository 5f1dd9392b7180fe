"""`rlvr validate` refuses data a run could not use: one line, exit 2, no traceback (issue 23)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from tests.unit.recipe.helpers import one_error_line

runner = CliRunner()

RECIPE = """
[experiment]
name = "t"

[model]
config = {{ hidden_size = 32 }}

[data]
domain_interleave_probs = {{ math = 0.5, code = 0.5 }}

[domains.math]
tags = ["math"]
files = ["{files}"]
eval_files = [{eval_files}]
reward = "math_rule"

[domains.code]
tags = ["code"]
files = ["code.jsonl"]
reward = "code_sandbox"

[rollout]
n = 2
temperature = 0.7
"""
MATH = json.dumps({"tag": "math", "prompt": "1+1?", "ground_truth": "2"})
CODE = json.dumps({"tag": "code", "prompt": "f", "case_type": "assert", "test_cases": ["assert f(1) == 2"]})


@pytest.fixture(autouse=True)
def _restore_plugin_path(monkeypatch):
    """validate puts the recipe's folder on the plug-in path: keep it out of later tests."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("RLVR_PLUGIN_PATH", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the machine checks see a CPU-only machine


def write(tmp: Path, *, files: str = "math.jsonl", eval_files: str = "", code_rows: list[str] | None = None) -> Path:
    (tmp / "math.jsonl").write_text(MATH + "\n")
    (tmp / "code.jsonl").write_text("\n".join(code_rows or [CODE]) + "\n")
    path = tmp / "recipe.toml"
    path.write_text(textwrap.dedent(RECIPE).format(files=files, eval_files=eval_files))
    return path


def test_the_fixture_recipe_is_valid(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(write(tmp_path))])
    assert result.exit_code == 0, result.output


def test_code_row_whose_test_cases_do_not_fit_its_case_type(tmp_path: Path) -> None:
    bad = json.dumps({"tag": "code", "prompt": "f", "case_type": "assert", "test_cases": {"f(1)": 2}})
    path = write(tmp_path, code_rows=[CODE] * 6 + [bad])
    line = one_error_line(runner.invoke(app, ["validate", str(path)]))
    code = (tmp_path / "code.jsonl").resolve()
    assert line == (
        f"error: {code}:7: test_cases for case_type 'assert' must be a string or a non-empty list of strings (got dict)"
    )


def test_skip_mode_loads_past_a_bad_code_row(tmp_path: Path) -> None:
    bad = json.dumps({"tag": "code", "prompt": "f", "case_type": "pytest", "test_cases": ["assert f(1)"]})
    path = write(tmp_path, code_rows=[CODE, bad])
    result = runner.invoke(app, ["validate", str(path), "--set", "data.on_bad_row=skip"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("key", ["eval_files", "files"])
def test_a_directory_as_a_data_file(tmp_path: Path, key: str) -> None:
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "a.jsonl").write_text(MATH + "\n")
    path = write(tmp_path, eval_files='"evals"') if key == "eval_files" else write(tmp_path, files="evals")
    line = one_error_line(runner.invoke(app, ["validate", str(path)]))
    folder = (tmp_path / "evals").resolve()
    assert line == (
        f"error: domains.math.{key}: {folder} is a directory; expected a .jsonl/.json/.parquet file or a saved "
        "HF dataset folder (datasets' save_to_disk)"
    )


def test_a_saved_hf_dataset_folder_is_valid_eval_data(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([json.loads(MATH)]).save_to_disk(str(tmp_path / "evals"))
    result = runner.invoke(app, ["validate", str(write(tmp_path, eval_files='"evals"'))])
    assert result.exit_code == 0, result.output
