"""scripts/tool_showcase.py: the with/without-tool table, figure and examples come from each run's
metrics.jsonl and samples.jsonl (the launches themselves are tests/real/test_tool_showcase.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.unit.script_module import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tool_showcase.py"


def load():
    return load_script(SCRIPT)


def write_run(run: Path, *, tool: bool) -> None:
    calls = {"tools/mayors/call_rate": 1.0, "tools/mayors/calls_per_episode": 2.0} if tool else {}
    metrics = [
        {"step": 0, "time": 0.0, "eval/reward/mayors/accuracy": 0.125},
        {"step": 1, "time": 30.0, "reward/mayors/mean": 0.5, **calls},
        {"step": 2, "time": 70.0, "reward/mayors/mean": 0.75, **calls},
        {"step": 2, "eval/reward/mayors/accuracy": 0.875 if tool else 0.0},  # merges with step 2's row
    ]
    samples = [
        {"step": 0, "eval": True, "reward": 0.0, "completion": "first"},
        {"step": 2, "reward": 1.0, "completion": "a training sample"},  # not an eval answer
        {"step": 1, "eval": True, "reward": 0.0, "completion": "middle"},
        {"step": 2, "eval": True, "reward": 1.0, "completion": "last"},
    ]
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))


def test_summary_reads_the_curve_the_tool_use_and_the_first_and_last_greedy_answers(tmp_path: Path) -> None:
    module = load()
    show = next(s for s in module.SHOWCASES if s.key == "search")
    write_run(tmp_path / "search_tool", tool=True)
    res = module.summarize(show, tmp_path / "search_tool")
    assert res["eval_accuracy"] == {0: 0.125, 2: 0.875}
    assert res["train_reward"] == {1: 0.5, 2: 0.75} and res["calls_per_episode"] == {1: 2.0, 2: 2.0}
    assert res["seconds_per_step"] == 35.0  # 70 s over the 2 trained steps
    assert res["greedy_examples"] == {0: ["[reward 0.0] first"], 2: ["[reward 1.0] last"]}


def test_plot_only_writes_the_figure_and_the_summary(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "search_tool", tool=True)
    write_run(tmp_path / "runs" / "search_notool", tool=False)
    command = [sys.executable, str(SCRIPT), "--only", "search", "--plot-only"]
    command += ["--runs", str(tmp_path / "runs"), "--img", str(tmp_path / "img")]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "with tool: 0: 0.125 (1.00), 2: 0.875 (1.00)" in out and "no tool: 0: 0.125, 2: 0.000" in out
    assert (tmp_path / "img" / "tool_showcase_search.png").stat().st_size > 0
    summary = json.loads((tmp_path / "runs" / "summary.json").read_text())
    assert summary["search"]["no tool"]["eval_accuracy"] == {"0": 0.125, "2": 0.0}
