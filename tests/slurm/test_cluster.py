"""rlvr on a real SLURM cluster: submitit and hand-written sbatch jobs, requeue, scancel.

Run after `sudo slurm/test-cluster/up.sh`: `pytest -m slurm tests/slurm -s` (-s prints timings).
Each job is 2 CPU nodes: torchrun + the fake worker on node1, one rollout server on node2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rlvr.launch.slurm import FINAL_STATES, job_state, submit, wait_and_watch
from tests.slurm.conftest import job_processes, read_jsonl, sacct_field, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


def steps(run_dir) -> list[int]:
    return [int(row["step"]) for row in read_jsonl(run_dir / "metrics.jsonl")]


def wait_final(job_id: str, *, timeout: float = 120) -> str:
    return wait_for(
        lambda: (s := job_state(job_id)[0]) in FINAL_STATES and s, timeout=timeout, what=f"job {job_id} to end"
    )


def test_submit_runs_trainer_and_real_rollout_server(job_env, make_recipe, tiny_model_dir, monkeypatch, capsys):
    """submitit job: torchrun on node1, the real `rlvr serve` on node2, every step recorded."""
    monkeypatch.delenv("RLVR_SERVER_MODULE")
    recipe, run_dir = make_recipe(name="submit", steps=6, model=tiny_model_dir)
    started = time.monotonic()
    job = submit(recipe, run_dir=run_dir)
    state = wait_and_watch(job, run_dir, poll_s=1.0)
    elapsed = time.monotonic() - started
    assert state == "COMPLETED", (run_dir / "slurm").iterdir()
    assert steps(run_dir) == [1, 2, 3, 4, 5, 6]
    (attempt,) = read_jsonl(run_dir / "attempts.jsonl")
    assert attempt["node"] == "node1" and attempt["restart_count"] == 0
    (server,) = read_jsonl_dir(run_dir / "servers")
    assert server["host"] == "node2" and server["url"] == attempt["servers"][0]
    assert "rlvr embedded server" in (run_dir / "logs" / "rollout-0.log").read_text()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished"
    with capsys.disabled():
        print(f"\n[timing] submitit job with the real rollout server, 6 steps: {elapsed:.1f}s submit-to-COMPLETED")


def read_jsonl_dir(folder) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def _sbatch(script) -> str:
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    return out.stdout.strip().split(";")[0]


def test_rendered_sbatch_script_runs(job_env, make_recipe, capsys):
    """`rlvr sbatch`'s script, submitted by hand, does the same as the submitit job."""
    from rlvr.launch.sbatch import write_sbatch
    from rlvr.recipe.load import resolved_json

    recipe, run_dir = make_recipe(name="sbatch", steps=6)
    script = write_sbatch(recipe, run_dir=run_dir, recipe_json=resolved_json(recipe), python=sys.executable)
    started = time.monotonic()
    job_id = _sbatch(script)
    assert wait_final(job_id) == "COMPLETED", (run_dir / "slurm" / f"{job_id}.out").read_text()
    elapsed = time.monotonic() - started
    assert steps(run_dir) == [1, 2, 3, 4, 5, 6]
    assert sacct_field(job_id, "ExitCode") == "0:0"
    with capsys.disabled():
        print(f"\n[timing] sbatch job, 6 steps of 0.5 s: {elapsed:.1f}s submit-to-COMPLETED")


def _interrupt_and_resume(run_dir, job_id: str, command: list[str], *, label: str, capsys) -> None:
    """Interrupt after step 4, then expect: one resume at restart 1 from the checkpoint, every step once."""
    wait_for(lambda: len(steps(run_dir)) >= 4, timeout=90, what="step 4")
    interrupted = time.monotonic()
    subprocess.run(command, check=True)
    resumed = wait_for(
        lambda: len(a := read_jsonl(run_dir / "attempts.jsonl")) >= 2 and a, timeout=120, what="the resumed attempt"
    )
    resume_s = time.monotonic() - interrupted
    assert wait_final(job_id) == "COMPLETED"
    first, second = resumed[:2]
    assert (first["restart_count"], first["start_step"]) == (0, 0)
    assert second["restart_count"] == 1  # SLURM_RESTART_COUNT in the requeued attempt
    assert second["start_step"] >= 4  # resumed from the checkpoint, not from scratch
    assert steps(run_dir) == list(range(1, 17))  # every step exactly once across both attempts
    assert len(read_jsonl(run_dir / "attempts.jsonl")) == 2
    with capsys.disabled():
        print(f"\n[timing] {label}: interrupt-to-resume {resume_s:.1f}s (resumed at step {second['start_step']})")


def test_scontrol_requeue_resumes_from_checkpoint(job_env, make_recipe, capsys):
    """Preemption-style requeue from outside: SIGTERM, checkpoint, requeue, resume."""
    recipe, run_dir = make_recipe(name="requeue", steps=16)
    job = submit(recipe, run_dir=run_dir)
    _interrupt_and_resume(
        run_dir, job.job_id, ["scontrol", "requeue", job.job_id], label="scontrol requeue (submitit)", capsys=capsys
    )


def test_time_limit_signal_checkpoints_and_self_requeues(job_env, make_recipe, capsys):
    """The --signal=USR1@120 warning (sent early here): the node script requeues the job itself."""
    recipe, run_dir = make_recipe(name="usr1", steps=16)
    job = submit(recipe, run_dir=run_dir)
    _interrupt_and_resume(
        run_dir,
        job.job_id,
        ["scancel", "--signal=USR1", job.job_id],
        label="USR1 self-requeue (submitit)",
        capsys=capsys,
    )
    assert "SIGUSR1" in (run_dir / "events.jsonl").read_text()


def test_sbatch_trap_forwards_usr1_and_requeues(job_env, make_recipe, capsys):
    """The hand-written script's B:USR1 trap: forward through srun, wait for the checkpoint, requeue."""
    from rlvr.launch.sbatch import write_sbatch
    from rlvr.recipe.load import resolved_json

    recipe, run_dir = make_recipe(name="sbatch_usr1", steps=16)
    script = write_sbatch(recipe, run_dir=run_dir, recipe_json=resolved_json(recipe), python=sys.executable)
    job_id = _sbatch(script)
    _interrupt_and_resume(
        run_dir, job_id, ["scancel", "--batch", "--signal=USR1", job_id], label="USR1 trap (sbatch)", capsys=capsys
    )


def test_scancel_stops_everything(job_env, make_recipe, capsys):
    """scancel mid-run: the worker saves, status says stopped, no process of the job is left."""
    recipe, run_dir = make_recipe(name="cancel", steps=40)
    port = recipe.rollout.sglang.port
    job = submit(recipe, run_dir=run_dir)
    wait_for(lambda: len(steps(run_dir)) >= 3, timeout=90, what="step 3")
    assert job_processes(run_dir, port), "the job's processes should be visible while it runs"
    cancelled = time.monotonic()
    subprocess.run(["scancel", job.job_id], check=True)
    assert wait_final(job.job_id) == "CANCELLED"
    wait_for(lambda: not job_processes(run_dir, port), timeout=20, what="no leftover processes", poll=0.5)
    gone_s = time.monotonic() - cancelled
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "stopped"
    checkpoint = json.loads((run_dir / "checkpoint.json").read_text())
    assert checkpoint["step"] == steps(run_dir)[-1]  # saved on SIGTERM, nothing lost
    assert os.environ["RLVR_SERVER_MODULE"] == "tests.slurm.fake_server"
    with capsys.disabled():
        print(f"\n[timing] scancel to no processes left: {gone_s:.1f}s")
