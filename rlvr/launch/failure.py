"""Why a child failed, in one line: the root-cause error from its log, not torchrun's banner.

A failing trainer rank's log ends with torchrun's own traceback and a ChildFailedError
banner of ~20 lines; the line a user needs (`DataError: data/x.jsonl:7: invalid JSON`) is
above it. The launcher prints that line and the log's path (`failure`), and the run's
status.json says `failed` with the same line as an event.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from rlvr.process import Child, log_tail

_TORCHRUN_FAILED = re.compile(r"^[EWI]\d{4} .*\bfailed \(exitcode")  # torchrun's "E1203 ... failed (exitcode: 1)"
_ELASTIC = "torch.distributed.elastic"
_KILLED_RANK = re.compile(r"exitcode\s*:\s*(-\d+) \(pid: (\d+)\)")  # torchrun's summary of a signalled worker
_PYDANTIC = re.compile(r"\d+ validation errors? for \w+$")


class LaunchError(RuntimeError):
    """A child failed; one line: its name, exit code, root cause and log path."""


def failure(child: Child, what: str) -> LaunchError:
    """One line: who failed, the root cause from its log (not torchrun's banner), where the log is."""
    code = child.proc.returncode
    if code is not None and code < 0:  # killed from outside: its log's last words are not the cause
        return LaunchError(f"{child.name} {what}: killed by {_signal_name(-code)} (log: {child.log_path})")
    try:
        text = child.log_path.read_text(errors="replace") if child.log_path is not None else ""
    except FileNotFoundError:
        text = ""
    text = text[text.rfind("\n$ ") + 1 :]  # a restarted child appends to its log: its own run is the last
    root = text.rfind("Root Cause")  # torchrun's summary: the first rank to fail (the others it killed itself)
    rank = _KILLED_RANK.search(text, root if root >= 0 else 0)  # a worker killed from outside
    if rank is not None:
        signal_name = _signal_name(-int(rank.group(1)))
        return LaunchError(
            f"{child.name} {what}: a rank (pid {rank.group(2)}) was killed by {signal_name} (log: {child.log_path})"
        )
    return LaunchError(f"{child.name} {what}: {root_cause(text)} (log: {child.log_path})")


CLEAN_EXITS = (0, 3, 4)
"""The trainer's own exits: finished, stopped by a signal it was sent, stopped for a failure it stated."""


def trainer_crashed(code: int, log_path: Path | None, *, progressed: bool) -> bool:
    """A trainer exit the launcher restarts from the newest checkpoint: not one of its own exits,
    and either a signal (OOM kill, segfault, a node hiccup; torchrun reports its worker's as
    `exitcode: -N`) or after it trained a step, so not a start-up mistake a restart would repeat."""
    if code in CLEAN_EXITS:
        return False
    tail = log_tail(log_path) if log_path is not None else ""
    return code < 0 or "(exitcode: -" in tail or progressed


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def root_cause(log_text: str) -> str:
    """The first exception a traceback ended with (the first rank to fail), else the last words.

    Exception lines are the first unindented line after a `Traceback` header; torchrun's own
    ChildFailedError is skipped. A worker that exits with a message (SystemExit("...")) prints
    no traceback: then the last non-blank line before torchrun's failure report is the cause.
    """
    lines = log_text.splitlines()
    in_traceback = False
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
            continue
        if in_traceback and line and not line.startswith((" ", "\t")):
            in_traceback = False
            if _ELASTIC not in line and not line.startswith("During handling"):
                return _short(" ".join([line.strip(), *_continuation(lines[i + 1 :], _PYDANTIC.search(line))]))
    end = next((i for i, line in enumerate(lines) if _TORCHRUN_FAILED.match(line)), len(lines))
    last = [line.strip() for line in lines[:end] if line.strip() and not line.startswith("$ ")]
    return _short(last[-1]) if last else "no output"


def _continuation(lines: list[str], indented: object = None) -> list[str]:
    """A multi-line exception message goes on until a blank line or the next report. A pydantic
    error (`1 validation error for X`) says what is wrong on its indented lines: keep those, up to
    the "For further information" link."""
    out = []
    for line in lines:
        if indented and line.startswith("  ") and "For further information" not in line:
            out.append(line.strip())
            continue
        if (
            not line.strip()
            or line.startswith((" ", "\t", "Traceback", "During handling"))
            or _TORCHRUN_FAILED.match(line)
        ):
            break
        out.append(line.strip())
    return out


def _short(line: str, *, limit: int = 400) -> str:
    """`rlvr.data.base.DataError: x` -> `DataError: x` (the module path is noise here)."""
    head, sep, rest = line.strip().partition(": ")
    if "." in head and " " not in head:
        head = head.rsplit(".", 1)[1]
    text = f"{head}{sep}{rest}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def stated_error(run_dir: str | Path) -> str | None:
    """The trainer's own line when it stopped the run itself (status `failed` with an `error`, e.g.
    rewards past their failure budget or a judge that does not answer), with the checkpoint it
    saved on the way out; None when it did not say (a crash: then its log's root cause)."""
    from rlvr.rundir import read_status

    status = read_status(run_dir) or {}
    if status.get("state") != "failed" or not status.get("error"):
        return None
    return f"{status['error']}{checkpoint_note(run_dir)}"


def checkpoint_note(run_dir: str | Path) -> str:
    """What a failed run's line ends with: the checkpoint a rerun resumes from (nothing if none)."""
    from rlvr.rundir import RunDir, latest_checkpoint

    saved = latest_checkpoint(RunDir(run_dir).checkpoints)
    return f" (checkpoint {saved.name} saved; rerun the same command to resume)" if saved else ""
