"""The adaptive mix and difficulty pools through the rollout manager: a domain whose groups teach
nothing loses its share down to its floor and its prompts rest, the shares and pools are logged,
and a run stopped and resumed draws what the straight run drew (k = 0 and k = 1)."""

from __future__ import annotations

from typing import Any

import pytest

from rlvr.collect.manager import RolloutManager
from rlvr.recipe.schema import Recipe
from tests.unit.loop.test_rollout_manager import CharTokenizer, FakeEngine, FakeRewards, drive, recipe, samples

STEPS = 6


def adaptive_recipe(k: int) -> Recipe:
    base = recipe(k=k, steps=STEPS).model_dump()
    base["data"].update(mix="adaptive", mix_floor=0.25, mix_smoothing=0.5)
    base["domains"]["flat"]["pool"] = {"retire_after": 2, "retire_failed_after": 4, "revisit_after": 3}
    return Recipe.model_validate(base)


def make(k: int, *, version: int = 0) -> tuple[RolloutManager, FakeEngine]:
    engine = FakeEngine(3)
    engine.version = version  # the worker pushes the checkpoint's weights to fresh engines before the loop
    manager = RolloutManager(
        adaptive_recipe(k),
        train={"flat": samples("flat", 5), "mixed": samples("mixed", 5)},
        evals={},
        tokenizer=CharTokenizer(),
        client=engine,  # type: ignore[arg-type]
        rewards=FakeRewards(),  # type: ignore[arg-type]
    )
    return manager, engine


def run(k: int, steps: range, state: Any = None) -> tuple[list[tuple[Any, dict[str, float]]], Any]:
    manager, engine = make(k, version=steps.start)
    if state is not None:
        manager.load_state_dict(state)
    try:
        results = drive(manager, engine, steps=steps)
        return results, manager.state_dict(step=steps.stop)
    finally:
        manager.close()


@pytest.mark.parametrize("k", [0, 1])
def test_a_domain_that_teaches_nothing_falls_to_its_floor_and_a_resume_draws_the_same(k: int) -> None:
    straight, _ = run(k, range(STEPS))
    first, state = run(k, range(3))
    resumed, _ = run(k, range(3, STEPS), state=state)
    assert [b.prompts for b, _ in first + resumed] == [b.prompts for b, _ in straight]
    shares = [m["mix/flat"] for _, m in straight]
    assert shares[0] == 0.5  # the recipe's mix first
    assert shares[-1] == pytest.approx(0.25)  # every flat group scores alike: down to its floor
    assert all(m["groups/zero_spread_frac"] > 0 for _, m in straight[:2])
    assert max(m["pool/flat/resting_solved"] for _, m in straight) > 0  # flat prompts came back solved twice
