"""Fixtures for the real-cluster tests (`pytest -m slurm tests/slurm`, after slurm/test-cluster/up.sh).

Every test builds a quickstart-sized recipe on 2 CPU nodes (trainer on node1, one rollout
server on node2) in a fresh run directory under /tmp, which both emulated nodes see because
they are one host; on a real cluster the run directory would be on the shared filesystem.
The worker is tests/slurm/fake_worker.py (selected by RLVR_WORKER_MODULE, importable from the
job through PYTHONPATH), so these tests exercise the launcher, not the RL loop.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rlvr.process import free_port
from tests.conftest import ROOT

RECIPE = """
[experiment]
name = "{name}"
output_dir = "{output_dir}"
max_steps = {steps}
save_steps = 0

[model]
path = "{model}"
dtype = "float32"

[data]
prompts_per_step = 2
max_prompt_tokens = 64  # + max_new_tokens within the tiny model's 1024 positions

[domains.math]
tags = ["math"]
files = ["{data}"]
reward = "math_rule"

[rollout]
engine = "embedded"
n = 2
max_new_tokens = 8
max_batch = 4

[rollout.sglang]
port = {port}

[trainer]
strategy = "none"

[cluster]
kind = "slurm"
nodes = 2
gpus_per_node = 0
trainer_nodes = 1
time = "00:05:00"

[monitor]
tensorboard = false
dashboard = false
"""


@pytest.fixture(scope="session", autouse=True)
def slurm_cluster() -> None:
    """Skip (with the reason) rather than fail when there is no cluster to talk to.

    A fixture, not a collection hook, so a default `pytest` run (slurm tests deselected)
    never calls sinfo.
    """
    if shutil.which("sinfo") is None:
        pytest.skip("no SLURM client (sinfo); start the test cluster with slurm/test-cluster/up.sh")
    try:
        probe = subprocess.run(
            ["sinfo", "-h", "-t", "idle,mix,alloc", "-o", "%D"], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.skip("sinfo timed out: slurmctld is not answering; start it with slurm/test-cluster/up.sh")
    if probe.returncode != 0:
        pytest.skip(f"sinfo failed ({probe.stderr.strip()}); start the cluster with slurm/test-cluster/up.sh")
    nodes = sum(int(n) for n in probe.stdout.split() if n.isdigit())
    if nodes < 2:
        pytest.skip(f"the SLURM cluster has {nodes} usable node(s); these tests need 2")


@pytest.fixture
def job_env(monkeypatch):
    """The job inherits the submitter's environment (sbatch --export=ALL)."""
    monkeypatch.setenv("RLVR_WORKER_MODULE", "tests.slurm.fake_worker")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RLVR_SERVER_MODULE", "tests.slurm.fake_server")
    monkeypatch.setenv("RLVR_STOP_GRACE_S", "3")  # KillWait is 5 s on the test cluster
    monkeypatch.setenv("RLVR_MASTER_PORT", str(free_port()))
    monkeypatch.setenv("FAKE_STEP_S", "0.5")


@pytest.fixture
def make_recipe(tmp_path) -> Callable[..., tuple[object, Path]]:
    """(recipe, run_dir) for a 2-node CPU job; the model folder is any directory unless `model` is given."""
    from rlvr.recipe.load import load_recipe

    def make(*, name: str = "job", steps: int = 8, model: Path | None = None) -> tuple[object, Path]:
        data = tmp_path / "math.jsonl"
        data.write_text(
            "\n".join(
                json.dumps({"id": str(i), "prompt": f"{i}+1=", "tag": "math", "ground_truth": str(i + 1)})
                for i in range(4)
            )
            + "\n"
        )
        model_dir = model or tmp_path / "model"
        model_dir.mkdir(exist_ok=True)
        path = tmp_path / f"{name}.toml"
        path.write_text(
            RECIPE.format(
                name=name, output_dir=tmp_path / "runs", steps=steps, model=model_dir, data=data, port=free_port()
            )
        )
        recipe = load_recipe(path)
        return recipe, tmp_path / "runs" / name

    return make


def wait_for(predicate: Callable[[], object], *, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def job_processes(run_dir: Path, port: int) -> list[str]:
    """Processes of this job: command lines naming its run directory or its server's port."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    return [
        line
        for line in out.splitlines()[1:]
        if (str(run_dir) in line or f"--port {port}" in line) and line.split()[1][:1] != "Z"
    ]


def sacct_field(job_id: str, field: str) -> str:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", field], capture_output=True, text=True
    ).stdout.strip()
    return out.splitlines()[-1] if out else ""
