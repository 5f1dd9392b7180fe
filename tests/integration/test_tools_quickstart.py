"""The tools quickstart learns to use its tools (seeded margins, not timings): reward and tool-call
rate rise with tools, and the same recipe with tools off stays at the guessing level.

Slow (several minutes on 2 cores): `pytest -m slow tests/integration/test_tools_quickstart.py`.
These start real processes, exactly as `rlvr launch recipes/tools.toml` does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "tools.toml"
STEPS = 20
# Seeded; measured over steps 1-3 -> 18-20: reward 0.42 -> 0.74, tool-call rate 0.49 -> 0.93 (tools off: 0.03 -> 0.03).
MARGIN, RATE_MARGIN = 0.15, 0.25
pytestmark = pytest.mark.slow


def launch(out: Path, *overrides: str) -> dict[int, dict]:
    sets = [f"experiment.output_dir={json.dumps(str(out))}", f"experiment.max_steps={STEPS}", "experiment.eval_steps=0"]
    command = [sys.executable, "-m", "rlvr.cli", "launch", str(RECIPE), "--no-dashboard"]
    command += [x for s in [*sets, *overrides] for x in ("--set", s)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "tools" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row for row in rows}


def mean(by_step: dict[int, dict], key: str, steps: range) -> float:
    return sum(by_step[s][key] for s in steps) / len(steps)


def call_rate(row: dict) -> float:
    return (row["tools/math/call_rate"] + row["tools/facts/call_rate"]) / 2


def test_reward_and_tool_calls_rise_with_tools(tmp_path: Path) -> None:
    by_step = launch(tmp_path)
    assert sorted(by_step) == list(range(1, STEPS + 1))
    first, last = range(1, 4), range(STEPS - 2, STEPS + 1)
    assert mean(by_step, "reward/mean", last) > mean(by_step, "reward/mean", first) + MARGIN
    rates = {s: call_rate(row) for s, row in by_step.items()}
    assert sum(rates[s] for s in last) / 3 > sum(rates[s] for s in first) / 3 + RATE_MARGIN
    assert all(row["tools/math/errors"] == 0 and row["tools/math/timeouts"] == 0 for row in by_step.values())
    samples = [json.loads(line) for line in (tmp_path / "tools" / "samples.jsonl").read_text().splitlines()]
    assert any(s["tool_calls"] and s["reward"] == 1.0 for s in samples)


def test_with_tools_off_the_reward_stays_at_guessing_level(tmp_path: Path) -> None:
    by_step = launch(tmp_path, "domains.math.tools=[]", "domains.facts.tools=[]")
    assert not any(k.startswith("tools/") for row in by_step.values() for k in row)
    assert max(row["reward/math/mean"] for row in by_step.values()) == 0.0  # nobody multiplies in their head
    assert mean(by_step, "reward/mean", range(1, STEPS + 1)) < 0.15
