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


def command_and_env(out: Path, *overrides: str, steps: int = STEPS) -> tuple[list[str], dict[str, str]]:
    """`rlvr launch` of the real quickstart into `out` (no eval; `overrides` after the defaults), and
    its env: the repo on the path, a free master port, no stand-in worker or server."""
    sets = [
        f"experiment.output_dir={json.dumps(str(out))}",
        f"experiment.max_steps={steps}",
        "experiment.eval_steps=0",
        "experiment.save_steps=0",
        *overrides,
    ]
    command = [sys.executable, "-m", "rlvr.cli", "launch", "recipes/quickstart.toml", "--no-dashboard"]
    command += [x for s in sets for x in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLVR_MASTER_PORT": str(free_port())}
    env.pop("RLVR_WORKER_MODULE", None)
    env.pop("RLVR_SERVER_MODULE", None)
    return command, env


def launch(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    command, env = command_and_env(out, *overrides)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=850)


SLURM_TWO_NODES = ("cluster.kind=slurm", "cluster.nodes=2", 'cluster.time="00:14:00"')


def start_on_two_nodes(out: Path, *, steps: int, save_steps: int) -> subprocess.Popen:
    """The real quickstart submitted to the two-node test cluster, running in the background."""
    overrides = (f"experiment.save_steps={save_steps}", *SLURM_TWO_NODES, f"rollout.sglang.port={free_port()}")
    command, env = command_and_env(out, *overrides, steps=steps)
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(proc: subprocess.Popen, metrics: Path, step: int) -> None:
    import time

    deadline = time.monotonic() + 600
    while not metrics.exists() or len(metrics.read_text().splitlines()) < step:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"the job never reached step {step}"
        time.sleep(0.2)


def last_metrics(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return rows[-1]


def test_quickstart_on_two_slurm_nodes_matches_a_local_run(tmp_path: Path) -> None:
    port = free_port()
    slurm = launch(tmp_path / "slurm", *SLURM_TWO_NODES, f"rollout.sglang.port={port}")
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


def test_the_real_worker_requeued_mid_run_resumes_once_per_step_with_its_weights(tmp_path: Path) -> None:
    """`scontrol requeue` while the real quickstart trains on 2 nodes: the trainer saves at the end
    of its step and the job comes back (SLURM_RESTART_COUNT 1); it resumes from that checkpoint,
    logs every step exactly once, and its fresh rollout servers get the checkpoint's weights before
    the first wave (k = 0 drops any group sampled by older weights as stale: there is none)."""
    steps = 6
    out = tmp_path / "requeue"
    proc = start_on_two_nodes(out, steps=steps, save_steps=0)
    run_dir = out / "quickstart"
    metrics = run_dir / "metrics.jsonl"
    wait_for_step(proc, metrics, 2)
    job_id = json.loads((run_dir / "slurm" / "attempt.json").read_text())["attempt"].split(".")[0]
    subprocess.run(["scontrol", "requeue", str(job_id)], check=True, timeout=30)
    stdout, stderr = proc.communicate(timeout=800)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # every step once, none replayed
    events = [json.loads(line)["message"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    resumed = [m for m in events if m.startswith("resumed from ")]
    assert len(resumed) == 1, events
    at = int(resumed[0].rsplit(" at step ", 1)[1])
    assert 2 <= at < steps
    assert all(r.get("groups/stale", 0) == 0 for r in rows)  # no wave ran on weights older than its step
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


def test_a_trainer_rank_killed_on_its_node_is_restarted_there_from_its_checkpoint(tmp_path: Path) -> None:
    """SIGKILL the real worker on node1 mid-run: the node script restarts the trainer (one trainer
    node) from its newest checkpoint, the servers on node2 keep running and get its weights, the
    job finishes, every step is logged once, and the death is one line in events.jsonl."""
    import signal

    import psutil

    steps = 7
    out = tmp_path / "restart"
    proc = start_on_two_nodes(out, steps=steps, save_steps=2)
    run_dir = out / "quickstart"
    metrics = run_dir / "metrics.jsonl"
    wait_for_step(proc, metrics, 3)
    workers = [
        p for p in psutil.process_iter(["cmdline"])
        if "rlvr.worker" in " ".join(p.info["cmdline"] or []) and str(run_dir) in " ".join(p.info["cmdline"] or [])
        and "rlvr.trainer.torchrun" not in " ".join(p.info["cmdline"] or [])
    ]  # fmt: skip
    assert len(workers) == 1, workers
    os.kill(workers[0].pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=800)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    events = [json.loads(line)["message"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    died = [m for m in events if m.startswith(f"trainer died with code 1: a rank (pid {workers[0].pid}) was killed")]
    assert len(died) == 1 and "; restarting it in 2 s (attempt 1 of 3)" in died[0], events
    assert len([m for m in events if m.startswith("resumed from ")]) == 1, events
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
