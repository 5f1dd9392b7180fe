"""The real RL worker on the real cluster: `rlvr launch --set cluster.kind=slurm` on 2 nodes.

The trainer runs on node1, the rollout and judge servers on node2; the run must finish and
log the same metric names as the same recipe run locally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.slurm.conftest import free_port

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

STEPS = 2


def launch(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    sets = [
        f"experiment.output_dir={json.dumps(str(out))}",
        f"experiment.max_steps={STEPS}",
        "experiment.eval_steps=0",
        "experiment.save_steps=0",
        *overrides,
    ]
    command = [sys.executable, "-m", "rlvr.cli", "launch", "recipes/quickstart.toml", "--no-dashboard"]
    command += [x for s in sets for x in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLVR_MASTER_PORT": str(free_port())}
    env.pop("RLVR_WORKER_MODULE", None)
    env.pop("RLVR_SERVER_MODULE", None)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=850)


def last_metrics(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return rows[-1]


def test_quickstart_on_two_slurm_nodes_matches_a_local_run(tmp_path: Path) -> None:
    port = free_port()
    slurm = launch(
        tmp_path / "slurm",
        "cluster.kind=slurm",
        "cluster.nodes=2",
        'cluster.time="00:14:00"',
        f"rollout.sglang.port={port}",
    )
    assert slurm.returncode == 0, slurm.stdout[-3000:] + slurm.stderr[-3000:]
    local = launch(tmp_path / "local")
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    remote_run, local_run = tmp_path / "slurm" / "quickstart", tmp_path / "local" / "quickstart"
    remote, here = last_metrics(remote_run), last_metrics(local_run)
    assert set(remote) == set(here)
    servers = [json.loads(p.read_text()) for p in (remote_run / "servers").glob("*.json")]
    assert [s["host"] for s in servers] == ["node2"]
    assert (remote_run / "servers" / "judge.url").exists()
    assert json.loads((remote_run / "status.json").read_text())["state"] == "finished"
    assert remote["reward/words/errors"] == 0  # the judge on node2 answered
