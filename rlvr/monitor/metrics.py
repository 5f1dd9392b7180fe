"""The run directory as the single source of truth for progress: metrics, events and status.

The trainer (rank 0) writes `metrics.jsonl` (one JSON object of flat scalars per step),
`events.jsonl` (warnings and errors worth showing), `samples.jsonl` (a few episodes per domain and
step) and `status.json` (the run's state, replaced atomically). The dashboard in the launching
terminal, `rlvr monitor RUN_DIR` in another terminal, and a login node watching a SLURM job all
read the same files, so nobody needs a socket to the job. TensorBoard (and optionally W&B) receive
the same scalars through `sinks.py`. Every metric name, and the run's speed (`throughput/tokens_per_s`)
against the trainer's (`tokens_per_s`): docs/monitoring.md.
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
        Rows are in step order, so what stays is a prefix: the file is truncated in place (same
        inode, one syscall), and a reader tailing it (`JsonlTail`) sees it shrink and carries on.
        Returns how many metrics rows were dropped. (TensorBoard keeps its points: it draws the
        rerun's over them.)"""
        dropped = 0
        for path, handle in ((self.paths.metrics, self._metrics), (self.paths.samples, self._samples)):
            if not path.exists():
                continue
            if handle is not None:
                handle.flush()
            keep, cut = 0, 0  # bytes kept; rows from the first one past `step` on
            with path.open("rb") as f:  # line by line: samples.jsonl of a long run is large
                for line in f:
                    if cut or _row_step(line) > step:
                        cut += 1
                    else:
                        keep += len(line)
            if not cut:
                continue
            if path == self.paths.metrics:
                dropped = cut
            os.truncate(path, keep)  # the handles append: they write at the new end
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


def _row_step(line: bytes | str) -> float:
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


def append_event(run_dir: str | Path, message: str, *, level: str = "error") -> None:
    """A launcher's line in events.jsonl (a death, a restart), beside the trainer's own."""
    with open(RunDir(run_dir).events, "a") as events:
        events.write(event_line(message, level=level))


def logged_steps(run_dir: str | Path) -> int:
    """How many steps metrics.jsonl holds: whether a trainer trained a step before it died."""
    try:
        with open(RunDir(run_dir).metrics) as rows:
            return sum(1 for line in rows if line.strip())
    except FileNotFoundError:
        return 0


class JsonlTail:
    """Incrementally reads new complete lines of a growing JSONL file (the dashboard's feed).

    The file may also be rewound (`RunRecorder.rewind` cuts the steps a resumed run does again)
    and then grow past where this reader was before it looks again: so it remembers each line it
    delivered (where it ends and a hash) and, when the last one is no longer where it was, carries
    on after the longest prefix of them the file still holds."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0  # the end of the last complete line delivered
        self._lines: list[tuple[int, int]] = []  # (end offset, hash) of each line delivered

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                if self._lines and not self._holds(handle, len(self._lines) - 1):
                    self._resync(handle)
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        out = []
        for line in chunk.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # an unfinished last line waits for the next read
            self.offset += len(line)
            self._lines.append((self.offset, hash(line)))
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out

    def _holds(self, handle: Any, i: int) -> bool:
        """Whether delivered line i is still in the file where it was."""
        start = self._lines[i - 1][0] if i else 0
        end, digest = self._lines[i]
        handle.seek(start)
        return hash(handle.read(end - start)) == digest

    def _resync(self, handle: Any) -> None:
        kept = 0
        while kept < len(self._lines) and self._holds(handle, kept):
            kept += 1
        del self._lines[kept:]
        self.offset = self._lines[-1][0] if self._lines else 0
