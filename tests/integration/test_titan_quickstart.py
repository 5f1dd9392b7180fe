"""The quickstart with `--set model.impl=torchtitan`: the same run, torchtitan's Qwen3 in the trainer.

Slow (a few minutes on 2 cores): `pytest -m slow tests/integration/test_titan_quickstart.py`.
Weight sync sends HF names from the torchtitan model to the embedded rollout server, so a
rising reward also says the server generates from the weights the trainer learned.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_quickstart import launch, metrics

pytestmark = [pytest.mark.slow, pytest.mark.torchtitan]


def test_quickstart_learns_with_torchtitan(tmp_path: Path) -> None:
    steps = 40
    result = launch(
        tmp_path, "model.impl=torchtitan", f"experiment.max_steps={steps}", "experiment.eval_steps=0",
        "experiment.save_steps=20",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    by_step = metrics(tmp_path / "quickstart")
    assert sorted(by_step) == list(range(1, steps + 1))
    first = sum(by_step[s]["reward/mean"] for s in range(1, 6)) / 5
    last = sum(by_step[s]["reward/mean"] for s in range(steps - 4, steps + 1)) / 5
    assert last > first + 0.15, (first, last)  # the transformers run's margin (test_quickstart.py)
    assert json.loads((tmp_path / "quickstart" / "status.json").read_text())["state"] == "finished"
    resolved = json.loads((tmp_path / "quickstart" / "resolved_recipe.json").read_text())
    assert resolved["model"]["impl"] == "torchtitan"
