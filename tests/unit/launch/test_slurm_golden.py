"""Golden tests: the sbatch script and submitit parameters for the flagship recipe on 4 x 8 GPUs.

Regenerate after an intended change with `RLVR_UPDATE_GOLDEN=1 pytest tests/unit/launch` and
review the diff of tests/unit/launch/golden/ like code.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from rlvr.launch.sbatch import render_sbatch
from rlvr.launch.slurm import sbatch_flag_dict, slurm_time_minutes, submitit_parameters
from rlvr.recipe.load import load_recipe
from tests.conftest import ROOT

GOLDEN = Path(__file__).parent / "golden"
FLAGSHIP = ROOT / "recipes" / "math_code_judge.toml"
RUN_DIR = "/shared/runs/math_code_judge"


def check_golden(name: str, text: str, *, folder: Path = GOLDEN) -> None:
    path = folder / name
    if os.environ.get("RLVR_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run with RLVR_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} changed; if intended, regenerate with RLVR_UPDATE_GOLDEN=1"


@pytest.fixture(scope="module")
def flagship():
    return load_recipe(FLAGSHIP, ["cluster.nodes=4"])


def test_sbatch_script_golden(flagship):
    script = render_sbatch(flagship, run_dir=RUN_DIR, recipe_json_path=f"{RUN_DIR}/resolved_recipe.json")
    check_golden("math_code_judge_4x8.sbatch", script)
    # slurm/template.sbatch, the documented example for hand submission, is this same script
    check_golden("template.sbatch", script, folder=ROOT / "slurm")


def test_submitit_parameters_golden(flagship):
    check_golden("math_code_judge_4x8.submitit.json", json.dumps(submitit_parameters(flagship), indent=2) + "\n")


def test_submitit_accepts_the_parameters(flagship, tmp_path):
    """submitit renders the dict (unknown keys would raise) with the flags rlvr relies on."""
    from submitit.slurm.slurm import _make_sbatch_string

    text = _make_sbatch_string(
        command="python -u -m submitit.core._submit X", folder=tmp_path, **submitit_parameters(flagship)
    )
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --time=1440",
        "#SBATCH --signal=USR1@120",
        "#SBATCH --requeue",
        "#SBATCH --exclusive",
        "#SBATCH --partition=gpu",
        "#SBATCH --mem=480G",
        "#SBATCH --cpus-per-task=64",
    ):
        assert line in text.splitlines()
    assert "--signal=USR2" not in text  # one signal everywhere: USR1


def _directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        match = re.match(r"#SBATCH --([\w-]+)(?:=(.*))?$", line)
        if match:
            out[match.group(1)] = match.group(2) or ""
    return out


def test_sbatch_script_and_submitit_agree(flagship, tmp_path):
    """Hand submission and `rlvr launch` must ask SLURM for the same allocation."""
    from submitit.slurm.slurm import _make_sbatch_string

    ours = _directives(render_sbatch(flagship, run_dir=RUN_DIR, recipe_json_path="/x.json"))
    theirs = _directives(_make_sbatch_string(command="x", folder=tmp_path, **submitit_parameters(flagship)))
    for key in (
        "nodes",
        "ntasks-per-node",
        "gpus-per-node",
        "cpus-per-task",
        "mem",
        "partition",
        "requeue",
        "exclusive",
    ):
        assert ours[key] == theirs[key], key
    assert slurm_time_minutes(ours["time"]) == int(theirs["time"])
    assert ours["signal"] == "B:" + theirs["signal"]  # the script's trap requeues; submitit's tasks do


def test_script_runs_the_node_entry_on_every_node(flagship):
    script = render_sbatch(flagship, run_dir=RUN_DIR, recipe_json_path=f"{RUN_DIR}/resolved_recipe.json")
    assert 'srun --ntasks-per-node=1 --kill-on-bad-exit=0 "$PYTHON" -m rlvr.launch.node' in script
    assert "trap on_time_limit USR1" in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    assert "#   node(s) 1-3: 24 rollout server(s), engine sglang, 1 GPU(s) each" in script


def test_no_requeue_recipe_renders_no_requeue(flagship):
    recipe = flagship.model_copy(deep=True)
    recipe.cluster.requeue = False
    script = render_sbatch(recipe, run_dir=RUN_DIR, recipe_json_path="/x.json")
    assert "#SBATCH --no-requeue" in script and "scontrol requeue" not in script
    assert submitit_parameters(recipe)["additional_parameters"]["no_requeue"] is True


def test_optional_settings_and_setup_lines(flagship):
    recipe = flagship.model_copy(deep=True)
    cluster = recipe.cluster
    cluster.account, cluster.qos, cluster.constraint = "proj", "high", "h100"
    cluster.setup = ["module load cuda/12.4", "source /shared/venv/bin/activate"]
    params = submitit_parameters(recipe)
    assert (params["account"], params["qos"], params["constraint"]) == ("proj", "high", "h100")
    assert params["setup"] == cluster.setup
    script = render_sbatch(recipe, run_dir=RUN_DIR, recipe_json_path="/x.json")
    assert "#SBATCH --account=proj" in script and "#SBATCH --qos=high" in script
    assert script.index("module load cuda/12.4") < script.index("\nsrun ")


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("30", 30),
        ("90:30", 91),
        ("24:00:00", 1440),
        ("00:05:00", 5),
        ("1-00", 1440),
        ("2-03:04", 3064),
        ("1-00:00:01", 1441),
    ],
)
def test_slurm_time_minutes(text, minutes):
    assert slurm_time_minutes(text) == minutes


def test_sbatch_flag_dict():
    assert sbatch_flag_dict(["--exclusive", "--reservation=r1", "--gres gpu:8", "--mail-type=END"]) == {
        "exclusive": True,
        "reservation": "r1",
        "gres": "gpu:8",
        "mail_type": "END",
    }
    with pytest.raises(ValueError, match="extra_sbatch"):
        sbatch_flag_dict(["exclusive"])


def on_shared_disk(recipe):
    """The recipe as if this checkout were on a shared disk: its data files are resolved into the
    checkout, which a fresh clone into the system temp dir puts on a node-local path."""
    from rlvr.recipe.load import recipe_from_json, resolved_json

    return recipe_from_json(resolved_json(recipe).replace(json.dumps(str(ROOT))[1:-1], "/shared/rlvr"))


def test_node_local_paths_are_named_by_key(flagship):
    from rlvr.launch.sbatch import NODE_LOCAL, node_local_paths

    shared = on_shared_disk(flagship)
    assert node_local_paths(shared, run_dir=RUN_DIR, python="/shared/venv/bin/python") == []
    local = on_shared_disk(load_recipe(FLAGSHIP, ["cluster.nodes=4", 'model.path="/tmp/qwen"']))
    warnings = node_local_paths(local, run_dir="/tmp/runs/x", python="/tmp/venv/bin/python")
    assert len(warnings) == 3, warnings
    assert warnings[0].startswith("run directory (experiment.output_dir) = /tmp/runs/x is node-local (/tmp)")
    assert warnings[1].startswith("--python = /tmp/venv/bin/python")
    assert warnings[2].startswith("model.path = /tmp/qwen is node-local (/tmp)")
    assert not node_local_paths(shared, run_dir="/tmpfs-shared/x", python="/shared/py")  # a prefix, not a folder
    # the checkout's own data files are named exactly when the checkout itself is node-local
    named = node_local_paths(flagship, run_dir=RUN_DIR, python="/shared/py")
    in_temp = any(str(ROOT).startswith(root + "/") for root in NODE_LOCAL)
    assert bool(named) == in_temp and all(w.startswith("domains.") for w in named), named


def test_rlvr_sbatch_takes_the_nodes_python_and_warns_on_node_local_paths(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "job.sbatch"
    result = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "sbatch", str(FLAGSHIP), "--out", str(out)]
        + ["--python", "/shared/envs/rlvr/bin/python", "--set", f"experiment.output_dir={json.dumps(str(tmp_path))}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "PYTHON=/shared/envs/rlvr/bin/python" in out.read_text()
    warned = "warning: run directory (experiment.output_dir)" in result.stderr
    assert warned == str(tmp_path.resolve()).startswith("/tmp/"), result.stderr
