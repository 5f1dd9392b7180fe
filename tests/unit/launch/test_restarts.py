"""Restarts of dead rollout servers: bounded, spaced, each due once."""

from __future__ import annotations

import time

from rlvr.launch.restarts import Restarts


def test_restarts_are_bounded_spaced_and_due_once() -> None:
    restarts = Restarts(max_restarts=2, backoff_s=0.05)
    assert restarts.died("rollout-0") == (
        "restarting it in 0.05 s (attempt 1 of 2); it serves again after the next full weight push"
    )
    assert restarts.due() == []  # not yet
    time.sleep(0.06)
    assert restarts.due() == ["rollout-0"] and restarts.due() == []
    second = restarts.died("rollout-0")
    assert second is not None and second.startswith("restarting it in 0.1 s (attempt 2 of 2)")  # twice the pause
    assert restarts.died("rollout-0") is None  # out of restarts
    assert restarts.died("rollout-1") is not None  # counted per server


def test_a_child_that_ran_long_enough_since_its_restart_earns_its_budget_back() -> None:
    restarts = Restarts(max_restarts=1, backoff_s=0.01, stable_s=0.2)
    assert restarts.died("trainer", then="it resumes from checkpoint step_4") == (
        "restarting it in 0.01 s (attempt 1 of 1); it resumes from checkpoint step_4"
    )
    assert restarts.died("trainer") is None  # died again at once: a crash loop is bounded
    time.sleep(0.25)  # it ran past stable_s since its last restart
    again = restarts.died("trainer")
    assert again is not None and "(attempt 1 of 1)" in again
