"""Plain progress for logs: one line per step and one line at the end, read from the run directory.

`rlvr launch ... > log` (or under nohup, CI, a SLURM login-node script) has no terminal for the
live dashboard; without this it would print the run directory and then nothing until it exits.
Lines are plain text, no colour or control codes, flushed one by one so `tail -f log` shows them.
A resumed run says so (`resumed from step_4 (PATH)`, from the trainer's own event) and then
prints only the steps it runs: the rows an earlier launch logged are not printed again.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.monitor.metrics import JsonlTail, reward_domains
from rlvr.rundir import RunDir, read_status


def step_line(row: dict[str, Any], *, max_steps: int, wall_s: float | None = None) -> str:
    """`step 3/100  reward math 0.41 code 0.25 (3 failed)  kl 0.0012  4.1 s/step` — what a log
    reader scans for; samples a reward could not judge and rows skipped as too long are said.
    `wall_s`: the time since the previous step's row, which is what s/step means to a reader
    (`time/step` leaves out the previous step's logging and checkpoint); without it, `time/step`."""
    parts = [f"step {int(row.get('step', 0))}/{max_steps}"]
    rewards = [_reward_cell(row, name) for name in reward_domains(row)]
    if rewards:
        parts.append("reward " + " ".join(rewards))
    dropped = sorted(
        (k.split("/")[1], int(v)) for k, v in row.items() if k.startswith("data/") and k.endswith("/dropped")
    )
    if any(n for _, n in dropped):
        parts.append("skipped rows " + " ".join(f"{name} {n}" for name, n in dropped if n))
    evals = sorted(
        (key.split("/")[2], v) for key, v in row.items() if key.startswith("eval/reward/") and "/mean" in key
    )
    if evals:
        parts.append("eval " + " ".join(f"{name} {value:.3f}" for name, value in evals))
    for key, label, digits in (("kl", "kl", 4), ("entropy", "entropy", 3)):
        if key in row:
            parts.append(f"{label} {row[key]:.{digits}f}")
    if "time/step" in row:
        parts.append(f"{wall_s if wall_s is not None else row['time/step']:.1f} s/step")
    return "  ".join(parts)


def _reward_cell(row: dict[str, Any], name: str) -> str:
    mean = row.get(f"reward/{name}/mean")
    cell = f"{name} {mean:.3f}" if mean is not None else f"{name} --"
    failed = int(row.get(f"reward/{name}/failed") or 0)
    return f"{cell} ({failed} failed)" if failed else cell


_RESUMED = re.compile(r"^resumed from (?P<path>.+) at step (?P<step>\d+)$")  # rlvr.loop's event


def resumed_from(event: dict[str, Any]) -> tuple[int, str] | None:
    """(step, checkpoint path) when `event` is the trainer's `resumed from PATH at step N`."""
    match = _RESUMED.match(str(event.get("message", "")))
    return (int(match.group("step")), match.group("path")) if match else None


def _tail_from_end(path: Path) -> JsonlTail:
    """A tail that delivers only what is appended from now on (it reads what is there, and
    remembers it: a rewind of those rows is then told from new ones)."""
    tail = JsonlTail(path)
    tail.read_new()
    return tail


class PlainProgress:
    """Emits a line per step as metrics.jsonl grows; `poll()` again after a stop prints the rest.

    Rows and events already in the run directory when it is made belong to earlier launches:
    it starts after them (make it before the trainer starts).
    """

    def __init__(self, run_dir: str | Path, *, emit: Callable[[str], None]):
        self.run_dir = Path(run_dir)
        self.emit = emit
        paths = RunDir(self.run_dir)
        self._tail = _tail_from_end(paths.metrics)
        self._events = _tail_from_end(paths.events)
        self._last_time: float | None = None  # the previous row's `time` (this launch's rows only)

    def poll(self) -> None:
        for event in self._events.read_new():  # before the rows: the trainer resumes, then logs
            resumed = resumed_from(event)
            if resumed is not None:
                self.emit(f"resumed from step_{resumed[0]} ({resumed[1]})")
        rows = self._tail.read_new()
        if rows:
            max_steps = int((read_status(self.run_dir) or {}).get("max_steps") or 0)
            for row in rows:
                now = row.get("time")
                wall = now - self._last_time if now is not None and self._last_time is not None else None
                self._last_time = now
                self.emit(step_line(row, max_steps=max_steps, wall_s=wall))

    def follow(self, *, stop: Callable[[], bool], poll_s: float = 1.0) -> None:
        """Until `stop()`; the rows written meanwhile are emitted before returning."""
        while True:
            done = stop()
            self.poll()
            if done:
                return
            time.sleep(poll_s)


def follow(run_dir: str | Path, *, stop: Callable[[], bool], emit: Callable[[str], None], poll_s: float = 1.0) -> None:
    PlainProgress(run_dir, emit=emit).follow(stop=stop, poll_s=poll_s)


def final_line(run_dir: str | Path, *, code: int, max_steps: int = 0) -> str:
    """How the run ended and what to do next, from status.json and the launcher's exit code
    (`max_steps`: the recipe's, for a run stopped before its trainer wrote a status)."""
    status = read_status(run_dir) or {}
    step, total = int(status.get("step") or 0), int(status.get("max_steps") or max_steps)
    state = status.get("state")
    if code == 0 and state == "finished":
        return f"finished at {step}/{total}; results in {run_dir}"
    if state == "failed":
        return f"failed at step {step}/{total}; rerun the same command to resume from the last checkpoint"
    return f"stopped at step {step}/{total}: rerun the same command to resume"
