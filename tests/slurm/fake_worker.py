"""A stand-in for `rlvr.worker` with the same contract, for launcher tests (no model, no torch).

Selected with RLVR_WORKER_MODULE=tests.slurm.fake_worker (the job needs the repo root on
PYTHONPATH). torchrun starts it as `python -m tests.slurm.fake_worker --run-dir RUN --resume auto`.
It does what the launcher relies on and nothing else:

- reads RUN/resolved_recipe.json and waits for the plan's rollout servers (wait_for_servers),
  checking each registered URL answers /health;
- writes metrics.jsonl / status.json through RunRecorder, one step per FAKE_STEP_S (0.5 s);
- keeps RUN/checkpoint.json ({"step": n}, replaced atomically) and resumes after it;
- on SIGUSR1/SIGUSR2/SIGTERM finishes the current step, saves, and exits with
  EXIT_CHECKPOINTED (status `preempted` for USR1/USR2, `stopped` for TERM);
- appends one line per start to RUN/attempts.jsonl (restart count, first step, servers), so
  tests can see what each attempt did.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

from rlvr.launch.plan import make_plan
from rlvr.launch.servers import wait_for_servers
from rlvr.monitor.metrics import RunRecorder
from rlvr.recipe.load import recipe_from_json
from rlvr.rundir import write_json_atomic

EXIT_CHECKPOINTED = 3  # saved on a signal; the job may be requeued and resume
CHECKPOINT_FILE = "checkpoint.json"
ATTEMPTS_FILE = "attempts.jsonl"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--resume", default="auto")
    args = parser.parse_args()
    run_dir: Path = args.run_dir
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # only rank 0 records; the fake has no collective work
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        # only record: taking a lock here (Event.set) can deadlock against the interrupted code
        received.append(signum)

    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(sig, on_signal)

    recipe = recipe_from_json((run_dir / "resolved_recipe.json").read_text())
    plan = make_plan(recipe)
    servers = wait_for_servers(run_dir, count=len(plan.servers), timeout_s=float(os.environ.get("FAKE_WAIT_S", "300")))
    for server in servers:
        with urllib.request.urlopen(server.url + "/health", timeout=10) as response:
            assert response.status == 200, server
    checkpoint = run_dir / CHECKPOINT_FILE
    start = 0
    if args.resume == "auto" and checkpoint.exists():
        start = json.loads(checkpoint.read_text())["step"]
    with (run_dir / ATTEMPTS_FILE).open("a") as handle:
        record = {
            "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            "job_id": os.environ.get("SLURM_JOB_ID"),
            "node": os.environ.get("SLURMD_NODENAME"),
            "start_step": start,
            "servers": [s.url for s in servers],
            "pid": os.getpid(),
            "time": time.time(),
        }
        handle.write(json.dumps(record) + "\n")
    max_steps = recipe.experiment.max_steps
    recorder = RunRecorder(run_dir, max_steps=max_steps, name=recipe.experiment.name)
    recorder.set_state("running", step=start)
    step_s = float(os.environ.get("FAKE_STEP_S", "0.5"))
    step = start
    while step < max_steps and not received:
        began = time.time()
        time.sleep(step_s)
        step += 1
        recorder.log(step, {"reward/math": step / max_steps, "time/step": time.time() - began})
        if recipe.experiment.save_steps and step % recipe.experiment.save_steps == 0:
            write_json_atomic(checkpoint, {"step": step})
    write_json_atomic(checkpoint, {"step": step})
    if step >= max_steps:
        recorder.close("finished")
        return 0
    recorder.event(f"signal {signal.Signals(received[0]).name} at step {step}: checkpointed")
    recorder.close("stopped" if received[0] == signal.SIGTERM else "preempted")
    return EXIT_CHECKPOINTED


if __name__ == "__main__":
    raise SystemExit(main())
