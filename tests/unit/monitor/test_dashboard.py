"""The run directory feeds the dashboard: metrics, events and status, read incrementally."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.monitor.dashboard import RunView, watch
from rlvr.monitor.metrics import JsonlTail, RunRecorder
from rlvr.rundir import RunDir, read_status


def record(run_dir: Path, steps: int = 3) -> RunRecorder:
    recorder = RunRecorder(run_dir, max_steps=10, name="demo")
    for step in range(1, steps + 1):
        recorder.log(
            step,
            {
                "reward/math/mean": 0.1 * step,
                "reward/code/mean": 0.5,
                "reward/math/accuracy": 0.1 * step,
                "response_len/math": 20.0,
                "time/step": 2.0,
                "time/rollout": 1.8,
                "time/wait_rollout": 1.0,
                "time/train": 0.6,
                "time/sync": 0.2,
                "rollout/generation_idle_frac": 0.25,
                "rollout/staleness_max": 1.0,
                "groups/trained": 16.0 * step,
                "groups/stale": 0.0,
                "groups/filtered": 2.0,
                "groups/failed": 1.0,
                "groups/cancelled": 0.0,
                "reward/code/failed": 3.0,
                "throughput/tokens_per_s": 1234.0,
                "kl": 0.001,
                "bad": float("nan"),
            },
        )
    return recorder


def test_recorder_writes_jsonl_and_status(tmp_path: Path) -> None:
    recorder = record(tmp_path)
    recorder.event("judge timed out twice", level="warning")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "bad" not in rows[0]  # non-finite values are dropped, not written as NaN
    assert (read_status(tmp_path) or {})["state"] == "running"
    recorder.close()
    assert (read_status(tmp_path) or {})["state"] == "finished"


def test_tail_keeps_partial_lines_for_later(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step"')
    tail = JsonlTail(path)
    assert tail.read_new() == [{"step": 1}]
    with path.open("a") as handle:
        handle.write(": 2}\n")
    assert tail.read_new() == [{"step": 2}]
    assert tail.read_new() == []


def test_view_shows_domains_change_and_split(tmp_path: Path) -> None:
    recorder = record(tmp_path)
    recorder.event("sandbox: 3 timeouts", level="error")
    view = RunView(tmp_path)
    view.refresh()
    assert view.domains() == ["code", "math"]
    console = Console(record=True, width=120)
    console.print(view.render())
    text = console.export_text()
    assert "step 3/10" in text
    assert "+0.200" in text  # math reward went 0.1 -> 0.3
    assert "1.00 (50%)" in text  # the trainer waited half the step for its rollouts
    assert "48/0/2/1/0" in text and "25%" in text  # group ends, generation idle share
    code = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("code"))
    assert " 3 " in code  # its failed verdicts in the domain table
    assert "sandbox: 3 timeouts" in text


def test_view_shows_spread_shares_and_resting_prompts(tmp_path: Path) -> None:
    """No reward spread per domain always; the adaptive mix's shares and the pools' resting prompts
    when the run has them."""
    recorder = record(tmp_path, steps=1)
    recorder.log(2, {"reward/math/mean": 0.4, "reward/code/mean": 0.5, "zero_spread/math": 0.25,
                     "mix/math": 0.62, "mix/code": 0.38, "pool/math/resting_solved": 3.0,
                     "pool/math/resting_failed": 1.0})  # fmt: skip
    view = RunView(tmp_path)
    view.refresh()
    console = Console(record=True, width=200)
    console.print(view.render())
    text = console.export_text()
    header = next(line for line in text.splitlines() if "resp len" in line)
    assert "no spread" in header and "share" in header and "resting" in header
    math = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("math"))
    assert "25%" in math and "0.620" in math and "3 ok / 1 wrong" in math
    code = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("code"))
    assert "0.380" in code and code.rstrip("│ ").endswith("-")


def test_watch_returns_when_run_finishes(tmp_path: Path) -> None:
    record(tmp_path).close()
    with open(os.devnull, "w") as sink:
        view = watch(tmp_path, console=Console(file=sink), refresh_s=0.01)
    assert view.done


def test_monitor_command(tmp_path: Path) -> None:
    record(tmp_path).close()
    result = CliRunner().invoke(app, ["monitor", str(tmp_path), "--once"])
    assert result.exit_code == 0 and "demo" in result.stdout
    result = CliRunner().invoke(app, ["monitor", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "not a run directory" in result.stderr


def test_tools_table_shows_calls_turns_errors_and_latency(tmp_path: Path) -> None:
    recorder = RunRecorder(tmp_path, max_steps=10, name="tools")
    for step, rate in ((1, 0.25), (2, 0.75)):
        recorder.log(
            step,
            {
                "reward/math/mean": rate,
                "reward/words/mean": 0.5,
                "tools/math/calls_per_episode": rate * 1.2,
                "tools/math/call_rate": rate,
                "tools/math/errors": 3.0,
                "tools/math/timeouts": 1.0,
                "tools/math/latency_s": 0.043,
                "turns/math": 1.0 + rate,
            },
        )
    view = RunView(tmp_path)
    view.refresh()
    assert view.tool_domains() == ["math"]  # words calls no tool: no row
    console = Console(record=True, width=140)
    console.print(view.render())
    text = console.export_text()
    row = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("math") and "ms" in line)
    for cell in ("0.90", "75%", "+50 pt", "1.75", "3", "1", "43 ms"):
        assert cell in row, (cell, row)
    assert "Tools" in text


def test_no_tools_table_without_tool_metrics(tmp_path: Path) -> None:
    record(tmp_path)
    view = RunView(tmp_path)
    view.refresh()
    console = Console(record=True, width=120)
    console.print(view.render())
    assert view.tool_domains() == [] and "calls/ep" not in console.export_text()


def header(view: RunView) -> str:
    console = Console(record=True, width=140)
    console.print(view.render())
    return console.export_text().splitlines()[1]


def test_a_resumed_launch_waits_for_its_own_trainer_and_says_it_resumed(tmp_path: Path) -> None:
    """The status an earlier launch left (`stopped`) is not this launch's end: the launcher's
    dashboard must not close on it, and the header says where this launch's trainer resumed."""
    earlier = record(tmp_path)  # steps 1-3, then stopped
    earlier.close("stopped")
    earlier.set_state("stopped", started_at=time.time() - 100)  # that trainer started a while ago
    launched = time.time() - 50
    os.utime(RunDir(tmp_path).keep_launch_recipe("{}"), (launched, launched))  # `rlvr launch` keeps its recipe

    view = RunView(tmp_path)
    view.refresh()
    view.since_launch()
    assert not view.done and "[starting]" in header(view) and "resumed" not in header(view)

    calls = 0

    def stop() -> bool:  # the local launcher's: has the trainer exited?
        nonlocal calls
        calls += 1
        if calls == 2:  # the relaunched trainer starts, resumes from step_3 and trains step 4
            trainer = RunRecorder(tmp_path, max_steps=10, name="demo")
            trainer.event(f"resumed from {tmp_path}/checkpoints/step_3 at step 3", level="info")
            trainer.log(4, {"reward/math/mean": 0.5})
        return calls == 3

    with open(os.devnull, "w") as sink:
        watched = watch(tmp_path, console=Console(file=sink), refresh_s=0.01, stop=stop)
    assert calls == 3  # it did not end on the earlier launch's `stopped`
    assert watched.resumed_step() == 3
    line = header(watched)
    assert "[running]" in line and "step 4/10" in line and "resumed from step_3" in line, line


def test_monitor_shows_the_last_resume_of_the_trainer_it_reads(tmp_path: Path) -> None:
    recorder = RunRecorder(tmp_path, max_steps=10, name="demo")
    recorder.event(f"resumed from {tmp_path}/checkpoints/step_2 at step 2", level="info")
    recorder.log(3, {"reward/math/mean": 0.5})
    view = RunView(tmp_path)
    view.refresh()
    assert "resumed from step_2" in header(view)
    RunRecorder(tmp_path, max_steps=10, name="demo")  # a new trainer that started fresh
    view.refresh()
    assert view.resumed_step() is None and "resumed" not in header(view)


def write_recipe_json(run_dir: Path, *, max_staleness: int) -> None:
    RunDir(run_dir).recipe.write_text(json.dumps({"rollout": {"max_staleness": max_staleness}}))


def test_a_synchronous_run_shows_no_pipeline_idle_or_staleness(tmp_path: Path) -> None:
    """Generation waits for training by design when k = 0: "gen idle 25%" would read as a fault."""
    record(tmp_path).close()
    texts = {}
    for k in (0, 1):
        write_recipe_json(tmp_path, max_staleness=k)
        view = RunView(tmp_path)
        view.refresh()
        console = Console(record=True, width=200)
        console.print(view.render())
        texts[k] = console.export_text()
    assert "48/0/2/1/0" in texts[0] and "gen idle" not in texts[0] and "stale max" not in texts[0]
    assert "Rollout pipeline" in texts[1] and "gen idle" in texts[1] and "25%" in texts[1]


def test_monitor_once_into_a_file_cuts_no_cell(tmp_path: Path) -> None:
    record(tmp_path).close()
    write_recipe_json(tmp_path, max_staleness=1)
    result = CliRunner().invoke(app, ["monitor", str(tmp_path), "--once"])  # stdout is not a terminal
    assert result.exit_code == 0
    assert "…" not in result.stdout and "clip_frac" in result.stdout and "mismatch kl" in result.stdout
