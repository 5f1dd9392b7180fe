"""How many reward worker processes trainer rank 0 starts: from the cores it may use (its
affinity, not the node's count), the trainer ranks beside it, and whether a reward uses them."""

from __future__ import annotations

import os

import pytest

from rlvr.recipe.machine import cpu_cores
from rlvr.rewards.workers import reward_workers


@pytest.mark.parametrize(
    ("cpus", "ranks", "expected"),
    [
        (64, 8, 27),  # 64 - 8 ranks - 1 manager = 55, half of it
        (16, 4, 5),
        (4, 4, 1),  # nothing left: still one, so math_rule can run at all
        (256, 1, 32),  # capped
    ],
)
def test_workers_leave_the_trainer_ranks_their_cores(cpus: int, ranks: int, expected: int) -> None:
    assert reward_workers(["math_rule", "code_sandbox"], trainer_ranks_on_node=ranks, cpus=cpus) == expected


def test_no_worker_when_no_reward_uses_the_pool() -> None:
    assert reward_workers(["code_sandbox", "llm_judge", "qa_match"], trainer_ranks_on_node=1, cpus=64) == 0


def test_cores_come_from_the_affinity_not_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    assert cpu_cores() == 3
    assert reward_workers(["math_rule"], trainer_ranks_on_node=1) == 1
