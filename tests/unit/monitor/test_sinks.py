"""W&B: one run directory is one W&B run, across resumes (wandb itself is faked: not installed here)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlvr.monitor.sinks import make_sinks
from rlvr.rundir import RunDir


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A `wandb` module whose init records its arguments."""
    calls: list[dict[str, Any]] = []
    module = types.ModuleType("wandb")

    def init(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return SimpleNamespace(log=lambda metrics, step: None, finish=lambda: None)

    module.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def start(run_dir: Path) -> None:
    """What rank 0 of the trainer does on each start (rlvr.worker.build_recorder)."""
    monitor = SimpleNamespace(tensorboard=False, wandb=True, wandb_project="proj")
    for sink in make_sinks(monitor, run_dir=run_dir, name="exp", config={"a": 1}):
        sink.log(1, {"reward/mean": 0.5})
        sink.close()


def test_a_resumed_run_logs_to_the_same_wandb_run(tmp_path: Path, fake_wandb: list[dict[str, Any]]) -> None:
    start(tmp_path)
    start(tmp_path)  # the rerun that resumes
    first, again = fake_wandb
    assert first["id"] and first["id"] == again["id"] and first["resume"] == again["resume"] == "allow"
    assert (first["project"], first["name"], first["dir"]) == ("proj", "exp", str(tmp_path))
    assert RunDir(tmp_path).wandb_id.read_text().strip() == first["id"]
    start(tmp_path / "other")  # another run directory is another W&B run
    assert fake_wandb[2]["id"] != first["id"]
