"""scripts/plot_curves.py: the docs' curves come from a run's metrics.jsonl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.script_module import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plot_curves.py"


def load():
    return load_script(SCRIPT)


def write_run(run: Path) -> None:
    rows = [
        {"step": 0, "eval/reward/sums/mean": 0.2, "eval/sums/sums/mean": 0.2},
        {"step": 1, "reward/sums/mean": 0.1, "reward/mean": 0.1},
        {"step": 2, "reward/sums/mean": 0.3, "reward/mean": 0.3},
        {"step": 2, "eval/reward/sums/mean": 0.4},  # an eval row of a step merges with its train row
    ]
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_series_reads_eval_and_train_reward_per_domain(tmp_path):
    module = load()
    write_run(tmp_path / "run")
    steps = module.rows_by_step(tmp_path / "run")
    assert module.series(steps, "eval/reward/") == {"sums": ([0, 2], [0.2, 0.4])}
    assert module.series(steps, "reward/") == {"sums": ([1, 2], [0.1, 0.3])}  # not reward/mean, not eval/...


def test_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "run")
    out = tmp_path / "curves.png"
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "run"), "--out", str(out)], check=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
