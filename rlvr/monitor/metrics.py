"""The run directory as the single source of truth for progress: metrics, events and status.

The trainer (rank 0) writes three files; the dashboard in the launching terminal,
`rlvr monitor RUN_DIR` in another terminal, and a login node watching a SLURM job all
read the same files, so nobody needs a socket to the job:

- `metrics.jsonl`: one JSON object per step (`step`, `time`, then flat scalar names:
  `reward/<domain>/mean|accuracy|count|failed|timeouts|...` from the reward pool, `response_len/<domain>`,
  `eval/reward/<domain>/mean`, `time/step|wait_rollout|train|sync` (the step's critical path),
  `time/rollout` (the step's wave, generated beside training when asynchronous), `groups/*`,
  `rollout/staleness_*`, `throughput/tokens_per_s`, and the trainer's `loss`, `kl`, `entropy`,
  `clip_frac`, `mismatch_kl`, `tis_weight_mean`, ...);
- `events.jsonl`: warnings and errors worth showing (`time`, `level`, `message`);
- `samples.jsonl`: `monitor.log_samples` completions per domain each step (`step`, `domain`,
  `id`, `prompt`, `completion`, `reward`, `verdict`, `reason`, `ground_truth`, `finish_reason`), to
  read what the policy writes and why it scored what it did;
- `status.json`: the run's state (`running`, `finished`, `failed`, ...), step, max_steps,
  start time and pid; replaced atomically so a reader never sees half a file.

TensorBoard (and optionally W&B) receive the same scalars through `sinks.py`.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rlvr.rundir import DONE_STATES, RunDir, read_status, write_json_atomic


def reward_domains(row: dict[str, Any]) -> list[str]:
    """The domains a metrics row scores, as named by the reward pool's `reward/<domain>/count`
    (a domain whose every sample failed has a count and no mean)."""
    return sorted(
        {
            k.split("/")[1]
            for k in row
            if k.startswith("reward/") and k.count("/") == 2 and k.endswith(("/count", "/mean"))
        }
    )


def event_line(message: str, *, level: str) -> str:
    """One `events.jsonl` row (the trainer's recorder and the launcher write the same shape)."""
    return json.dumps({"time": time.time(), "level": level, "message": message}) + "\n"


class RunRecorder:
    """Appends metrics and events and keeps status.json current; one per run, on rank 0."""

    def __init__(self, run_dir: str | Path, *, max_steps: int, name: str = "", sinks: list[Any] | None = None):
        self.run_dir = Path(run_dir)
        self.paths = RunDir(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.sinks = sinks or []
        self.status: dict[str, Any] = {
            "name": name or self.run_dir.name,
            "state": "starting",
            "step": 0,
            "max_steps": max_steps,
            "started_at": time.time(),
            "pid": os.getpid(),
        }
        self._metrics = self.paths.metrics.open("a", encoding="utf-8")
        self._events = self.paths.events.open("a", encoding="utf-8")
        self._samples: Any = None  # opened on the first episodes (log_samples = 0: no file)
        write_json_atomic(self.paths.status, self.status)

    def rewind(self, step: int) -> int:
        """Forget the steps logged after `step` (a resume from `step`, or a fresh start at 0): they
        run again, and metrics.jsonl/samples.jsonl must log every step once. A killed attempt logs
        steps past its last checkpoint; without this a rerun would append them a second time.
        Returns how many metrics rows were dropped. (TensorBoard keeps its points: it draws the
        rerun's over them.)"""
        dropped = 0
        for path, handle in ((self.paths.metrics, "_metrics"), (self.paths.samples, "_samples")):
            if not path.exists():
                continue
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            kept = [line for line in lines if _row_step(line) <= step]
            if len(kept) == len(lines):
                continue
            if path == self.paths.metrics:
                dropped = len(lines) - len(kept)
            opened = getattr(self, handle)
            if opened is not None:
                opened.close()
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, path)  # a kill mid-rewrite leaves the old file or the new one, whole
            if opened is not None:
                setattr(self, handle, path.open("a", encoding="utf-8"))
        return dropped

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(float(v))}
        self._metrics.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        self._metrics.flush()
        for sink in self.sinks:
            sink.log(step, clean)
        self.set_state("running", step=step)

    def samples(self, rows: list[dict[str, Any]]) -> None:
        """Append whole episodes to samples.jsonl (see rlvr.monitor.samples)."""
        if not rows:
            return
        if self._samples is None:
            self._samples = self.paths.samples.open("a", encoding="utf-8")
        for row in rows:
            self._samples.write(json.dumps(row) + "\n")
        self._samples.flush()

    def event(self, message: str, *, level: str = "warning") -> None:
        self._events.write(event_line(message, level=level))
        self._events.flush()

    def set_state(self, state: str, **fields: Any) -> None:
        self.status.update(state=state, **fields)
        write_json_atomic(self.paths.status, self.status)

    def close(self, state: str = "finished", *, error: str | None = None) -> None:
        """The run's last word; `error` is the one line a failed run stopped for (the launcher prints it)."""
        self.set_state(state, ended_at=time.time(), **({"error": error} if error else {}))
        for sink in self.sinks:
            sink.close()
        self._metrics.close()
        self._events.close()
        if self._samples is not None:
            self._samples.close()


def _row_step(line: str) -> float:
    """A jsonl row's step; a torn last line (the kill landed mid-write) counts as past every step."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def mark_failed(run_dir: str | Path, message: str, **fields: Any) -> None:
    """The launcher's word when a child died: status `failed` plus an error event with the cause.

    A trainer that dies during start-up never reaches its own `close("failed")`, and one killed
    by a signal cannot write at all; without this, status.json would say `starting` (or
    `running`) forever and `rlvr monitor` would wait for it.
    """
    paths = RunDir(run_dir)
    status = {**fields, **(read_status(run_dir) or {})}
    said = status.get("state") == "failed" and status.get("error") and str(status["error"]) in message
    status.update(state="failed", ended_at=time.time(), error=message)
    write_json_atomic(paths.status, status)
    if not said:  # the trainer's own error event already says it
        with paths.events.open("a", encoding="utf-8") as events:
            events.write(event_line(message, level="error"))


def mark_stopped(run_dir: str | Path) -> None:
    """The launcher's word after a stop it asked for: `stopped`, unless the trainer already
    recorded how it ended. A trainer killed mid-save (or by torchrun's shutdown clock) never
    reaches `close("stopped")`; without this its last word, `running`, would stand."""
    paths = RunDir(run_dir)
    status = read_status(run_dir)
    if status is not None and status.get("state") not in DONE_STATES:
        status.update(state="stopped", ended_at=time.time())
        write_json_atomic(paths.status, status)


class JsonlTail:
    """Incrementally reads new complete lines of a growing JSONL file (the dashboard's feed)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self._partial = ""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open(encoding="utf-8") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
                self.offset = handle.tell()
        except FileNotFoundError:
            return []
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next read
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out
