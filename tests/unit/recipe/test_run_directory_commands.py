"""`plan` and `sbatch` never overwrite an existing run's resolved recipe (what eval and a resume read);
`launch` refuses a run directory another launch holds, and says so when the run already finished."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.rundir import RunDir, write_json_atomic
from tests.conftest import ROOT

QUICKSTART = ROOT / "recipes" / "quickstart.toml"
FLAGSHIP = ROOT / "recipes" / "math_code_judge.toml"


def existing_run(out: Path, name: str) -> RunDir:
    paths = RunDir(out / name)
    write_json_atomic(paths.status, {"state": "finished", "step": 3, "max_steps": 3})
    paths.write_recipe('{"rollout": {"n": 8}}')
    return paths


def test_plan_leaves_an_existing_runs_recipe_alone(tmp_path: Path) -> None:
    paths = existing_run(tmp_path, "quickstart")
    out = f"experiment.output_dir={json.dumps(str(tmp_path))}"
    result = CliRunner().invoke(app, ["plan", str(QUICKSTART), "--set", out, "--set", "rollout.n=2"])
    assert result.exit_code == 0, result.output
    assert paths.recipe.read_text() == '{"rollout": {"n": 8}}'
    assert f"not writing {paths.recipe}" in result.output
    fresh = CliRunner().invoke(app, ["plan", str(QUICKSTART), "--set", out, "--set", "experiment.name=other"])
    assert fresh.exit_code == 0 and (tmp_path / "other" / "resolved_recipe.json").exists()


def test_sbatch_refuses_a_run_made_from_a_different_recipe(tmp_path: Path) -> None:
    sets = ["--set", f"experiment.output_dir={json.dumps(str(tmp_path))}", "--set", "cluster.nodes=4"]
    first = CliRunner().invoke(app, ["sbatch", str(FLAGSHIP), *sets])
    assert first.exit_code == 0, first.output
    paths = RunDir(tmp_path / "math_code_judge")
    write_json_atomic(paths.status, {"state": "stopped", "step": 2, "max_steps": 10})
    before = paths.recipe.read_text()
    same = CliRunner().invoke(app, ["sbatch", str(FLAGSHIP), *sets])  # resubmitting the same run is fine
    assert same.exit_code == 0, same.output
    changed = CliRunner().invoke(app, ["sbatch", str(FLAGSHIP), *sets, "--set", "rollout.n=2"])
    assert changed.exit_code == 2
    assert "holds a run made from a different recipe (rollout.n: 8 -> 2)" in changed.output
    assert paths.recipe.read_text() == before


def test_launch_refuses_a_held_run_directory_and_a_finished_run(tmp_path: Path) -> None:
    out = ["--set", f"experiment.output_dir={json.dumps(str(tmp_path))}", "--set", "experiment.max_steps=3"]
    paths = existing_run(tmp_path, "quickstart")
    done = CliRunner().invoke(app, ["launch", str(QUICKSTART), *out])
    assert done.exit_code == 0
    assert "already finished at 3/3; nothing to do" in done.output
    assert paths.recipe.read_text() == '{"rollout": {"n": 8}}'  # nothing started, nothing rewritten
    with paths.lock():
        held = CliRunner().invoke(app, ["launch", str(QUICKSTART), *out, "--set", "experiment.max_steps=5"])
    assert held.exit_code == 2
    assert "run active (pid " in held.output and "another experiment.name" in held.output
    assert paths.recipe.read_text() == '{"rollout": {"n": 8}}'
