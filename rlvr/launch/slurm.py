"""Submit a recipe to SLURM with submitit, and watch it from the login node.

`submit` writes the resolved recipe into the run directory (on a filesystem every node shares) and
submits one task per node; each runs `rlvr.launch.node`, which decides from the plan whether its
node trains or serves rollouts. `wait_and_watch` shows the queue state while the job is pending and
the live dashboard (fed by the run directory) while it runs, across requeues, and returns SLURM's
final state. Preemption and time limits are handled by rlvr (`--requeue`, `--signal=USR1@120`, the
node script checkpoints and requeues), not by submitit's Checkpointable, which ignores SIGTERM,
acts on rank 0 only and cannot wait for a child's checkpoint (docs/cluster.md). Nothing heavy is
imported at module level: `rlvr launch` must start fast on a login node.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.recipe.schema import Recipe
from rlvr.rundir import RunDir

SIGNAL = "USR1"
SIGNAL_DELAY_S = 120  # time-limit warning: enough for an FSDP checkpoint of a 7B model

# squeue/sacct states after which the job will not run again
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "REVOKED",
    }
)


class SlurmError(RuntimeError):
    """Submission failed (no sbatch here, or sbatch refused the job); `str()` says why."""


def slurm_time_minutes(text: str) -> int:
    """SLURM's --time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:
        hours, (minutes, seconds) = 0, (parts + [0])[:2]
    total_s = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    return max(1, -(-total_s // 60))


def sbatch_flag_dict(flags: list[str]) -> dict[str, str | bool]:
    """`["--exclusive", "--reservation=r", "--gres gpu:8"]` -> submitit's additional_parameters."""
    out: dict[str, str | bool] = {}
    for flag in flags:
        match = re.fullmatch(r"--?([A-Za-z][\w-]*)(?:[= ]\s*(.+))?", flag.strip())
        if not match:
            raise ValueError(f"cluster.extra_sbatch: expected a flag such as --exclusive or --key=value, got {flag!r}")
        key, value = match.group(1).replace("-", "_"), match.group(2)
        out[key] = True if value is None else value
    return out


def submitit_parameters(recipe: Recipe) -> dict[str, Any]:
    """`SlurmExecutor.update_parameters` keywords for a recipe (pure; golden-tested).

    One task per node: submitit runs the node function once per task, and the node script
    starts torchrun or the rollout servers itself. The GPUs are left to that script, so
    each task sees every GPU of its node.
    """
    cluster = recipe.cluster
    params: dict[str, Any] = {
        "job_name": f"rlvr-{recipe.experiment.name}",
        "nodes": cluster.nodes,
        "ntasks_per_node": 1,
        "time": slurm_time_minutes(cluster.time),
        "signal_delay_s": SIGNAL_DELAY_S,
        "stderr_to_stdout": True,
    }
    if cluster.gpus_per_node:
        params["gpus_per_node"] = cluster.gpus_per_node
    optional = {
        "cpus_per_task": cluster.cpus_per_task,
        "mem": cluster.mem,
        "partition": cluster.partition,
        "account": cluster.account,
        "qos": cluster.qos,
        "constraint": cluster.constraint,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    # submitit's own signal is USR2; rlvr uses USR1 everywhere (node script and sbatch script)
    additional: dict[str, Any] = {"signal": f"{SIGNAL}@{SIGNAL_DELAY_S}"}
    additional["requeue" if cluster.requeue else "no_requeue"] = True
    additional.update(sbatch_flag_dict(cluster.extra_sbatch))
    params["additional_parameters"] = additional
    if cluster.setup:
        params["setup"] = list(cluster.setup)
    return params


def run_node_task(run_dir: str, self_requeue: bool = True) -> int:
    """What submitit runs on every node; a non-zero trainer exit becomes a failed task."""
    from rlvr.launch.node import run

    rc = run(run_dir, self_requeue=self_requeue)
    if rc != 0:
        raise RuntimeError(f"the trainer exited with code {rc}; see the job log in {RunDir(run_dir).slurm}")
    return rc


def submit(recipe: Recipe, *, run_dir: str | Path, recipe_json: str | None = None) -> Any:
    """Submit the recipe; returns the submitit Job (its `.job_id` is SLURM's).

    `recipe_json` is the resolved recipe text (default: dumped from `recipe`); it is written
    to RUN/resolved_recipe.json, which every node and the worker read.
    """
    import shutil

    import submitit
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    from rlvr.recipe.load import resolved_json

    if shutil.which("sbatch") is None:
        raise SlurmError("sbatch not found: submit from a SLURM login node (or use cluster.kind = 'local')")
    paths = RunDir(Path(run_dir).resolve())
    paths.write_recipe(recipe_json if recipe_json is not None else resolved_json(recipe))
    executor = submitit.SlurmExecutor(folder=paths.slurm, max_num_timeout=0)
    executor.update_parameters(**submitit_parameters(recipe))
    try:
        return executor.submit(run_node_task, str(paths.root), recipe.cluster.requeue)
    except (OSError, subprocess.CalledProcessError, FailedJobError, FailedSubmissionError) as exc:
        reasons = [r.strip() for r in re.split(r"sbatch: error:|\n", str(exc)) if r.strip()]
        raise SlurmError(f"sbatch refused the job: {'; '.join(dict.fromkeys(reasons))}") from None


def job_state(job_id: str) -> tuple[str, str]:
    """(state, reason) from squeue, or from sacct once the job has left the queue.

    Polling squeue is cheap for slurmctld; sacct is asked only when squeue no longer knows
    the job. ("UNKNOWN", "") when neither answers (e.g. accounting is off and the job is gone).
    """
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%T|%r"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    if out:
        state, _, reason = out.splitlines()[0].partition("|")
        return state.strip(), "" if reason.strip() in ("None", "(null)") else reason.strip()
    try:
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    if out:
        return out.splitlines()[-1].split()[0], ""
    return "UNKNOWN", ""


def wait_and_watch(
    job: Any,
    run_dir: str | Path,
    *,
    console: Any = None,
    poll_s: float = 2.0,
    dashboard: bool = True,
    state_fn: Callable[[str], tuple[str, str]] = job_state,
) -> str:
    """Show the queue state while pending and the dashboard while running; return the final state.

    `job` is a submitit Job or a job id. The dashboard's own end (status.json finished,
    failed or stopped) is not the job's end: a preempted attempt says `stopped` and the
    requeued one starts over, so the loop follows SLURM's state and re-attaches. Ctrl-C
    detaches (the job keeps running) and returns the current state.
    """
    from rich.console import Console

    from rlvr.monitor.dashboard import watch
    from rlvr.monitor.progress import PlainProgress
    from rlvr.rundir import DONE_STATES, read_status

    job_id = str(getattr(job, "job_id", job))
    run_dir = Path(run_dir)
    console = console or Console()
    state, reason = state_fn(job_id)
    shown: tuple[str, str] | None = None
    finished_run: Any = None  # started_at of a run whose end the dashboard already showed
    last_poll = time.monotonic()

    def plain(line: str) -> None:
        console.print(line, soft_wrap=True, highlight=False, markup=False)

    progress = PlainProgress(run_dir, emit=plain)  # one reader across requeues: each line said once

    def run_over(run_dir: Path) -> bool:
        return (read_status(run_dir) or {}).get("state") in DONE_STATES

    def job_over() -> bool:
        nonlocal state, reason, last_poll
        if time.monotonic() - last_poll >= poll_s:
            state, reason = state_fn(job_id)
            last_poll = time.monotonic()
        return state in FINAL_STATES

    try:
        while state not in FINAL_STATES:
            status = read_status(run_dir)
            attached = status is not None and status.get("started_at") != finished_run
            if dashboard and state == "RUNNING" and attached:
                if console.is_terminal:
                    watch(run_dir, console=console, stop=job_over)
                else:  # a log file: one plain line per step, not the last frame of a live view
                    progress.follow(stop=lambda: job_over() or run_over(run_dir))
                if run_over(run_dir):
                    status = read_status(run_dir) or {}
                    finished_run = status.get("started_at")
                    if not console.is_terminal:
                        plain(f"run {status.get('state')} at step {status.get('step')}/{status.get('max_steps')}")
                continue
            if (state, reason) != shown:
                console.print(f"job {job_id}: {state}" + (f" ({reason})" if reason else ""))
                shown = (state, reason)
            time.sleep(min(poll_s, 1.0))
            job_over()
    except KeyboardInterrupt:
        console.print(f"detached; job {job_id} keeps running. Watch: rlvr monitor {run_dir}   Stop: scancel {job_id}")
        return state
    console.print(f"job {job_id}: {state}")
    return state


def launch(recipe: Recipe, *, run_dir: str | Path, recipe_json: str | None = None, dashboard: bool = True) -> int:
    """`rlvr launch` for cluster.kind = "slurm": submit, watch, exit 0 only if the job completed."""
    from rich.console import Console

    console = Console()
    job = submit(recipe, run_dir=run_dir, recipe_json=recipe_json)
    run_dir = Path(run_dir).resolve()
    console.print(
        f"submitted job {job.job_id} ({recipe.cluster.nodes} nodes); run dir {run_dir}; "
        f"logs {RunDir(run_dir).slurm}; stop with: scancel {job.job_id}"
    )
    state = wait_and_watch(job, run_dir, console=console, dashboard=dashboard and recipe.monitor.dashboard)
    code = 0 if state == "COMPLETED" else 1
    if state in FINAL_STATES:
        from rlvr.launch.failure import stated_error
        from rlvr.monitor.metrics import mark_failed
        from rlvr.monitor.progress import final_line
        from rlvr.rundir import read_status

        stated = stated_error(run_dir) if code else None
        if stated:  # the trainer stopped the run itself and said why (e.g. rewards that cannot judge)
            Console(stderr=True).print(f"error: {stated}", soft_wrap=True, highlight=False, markup=False)
        elif code and (read_status(run_dir) or {}).get("state") not in ("failed", "stopped"):
            mark_failed(run_dir, f"job {job.job_id} ended {state}; logs in {RunDir(run_dir).slurm}")
        console.print(
            final_line(run_dir, code=code, max_steps=recipe.experiment.max_steps),
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    return code
