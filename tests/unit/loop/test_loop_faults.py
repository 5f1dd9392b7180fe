"""The loop's failure paths with the real in-process parts: a rollout that fails for good, and a
weight push that fails part-way. Each stops the run with the trainer's finished steps saved and
one line that says why; a failed push leaves the engine paused (never serving a mix of two
versions) and the rollout manager's gate closed; the rerun resumes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlvr.loop import FAILED_EXIT
from rlvr.rollout.base import RolloutError

from .test_loop import make_loop, model_dir, run, weights  # noqa: F401 - model_dir is a fixture

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def checkpoints(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))


def test_a_rollout_that_fails_for_good_stops_with_the_finished_steps_saved(tmp_path, model_dir):  # noqa: F811
    loop = make_loop(tmp_path, model_dir, steps=3)
    engine = loop.manager.client  # type: ignore[union-attr]
    real = engine.generate
    calls = {"n": 0}

    async def generate(requests: list[Any]) -> Any:
        calls["n"] += sum(r.n for r in requests)  # samples: a group's n-sample request counts n
        if calls["n"] > 4 * 4:  # step 1's 16 episodes, then every server is gone
            raise RolloutError("no live rollout servers")
        return await real(requests)

    engine.generate = generate
    metrics = run(loop, expect=FAILED_EXIT)
    assert [m["step"] for m in metrics] == [1]
    assert loop.failure == "rollout failed in step 2: no live rollout servers"
    assert checkpoints(tmp_path) == ["step_1"]


def test_a_push_that_fails_part_way_keeps_the_step_and_the_engine_paused(tmp_path, model_dir):  # noqa: F811
    loop = make_loop(tmp_path, model_dir, steps=3)
    engine = loop.manager.client  # type: ignore[union-attr]
    real = engine.load_state_dict
    served = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    pushes = {"n": 0}

    def load_state_dict(tensors: Any, *, version: str | None) -> None:
        pushes["n"] += 1
        real(tensors[: len(tensors) // 2], version=None)  # half of the new weights land, then the copy dies
        raise OSError("copy failed")

    engine.load_state_dict = load_state_dict
    metrics = run(loop, expect=FAILED_EXIT)
    assert [m["step"] for m in metrics] == [1]  # step 1 trained and logged; its push failed
    assert loop.failure is not None and loop.failure.startswith("weight sync to version 1 failed after 0 tensors: ")
    assert "OSError('copy failed')" in loop.failure
    assert checkpoints(tmp_path) == ["step_1"]  # the trained step is kept
    assert engine.paused and pushes["n"] == 1  # never resumed on half of the new weights
    assert not loop.manager.scheduler.weights_ready.is_set()  # type: ignore[union-attr]  # the gate stayed closed
    assert any(not torch.equal(served[k], v) for k, v in engine.model.state_dict().items())  # it is a mix

    again = make_loop(tmp_path, model_dir, steps=3)  # the rerun: step_1's weights pushed, steps 2-3
    metrics = run(again, resume="auto")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    served = again.manager.client.model.state_dict()  # type: ignore[union-attr]
    trained = weights(again)
    shared = [k for k in trained if k in served]
    assert len(shared) == len(trained) and all(torch.equal(served[k], trained[k]) for k in shared)
