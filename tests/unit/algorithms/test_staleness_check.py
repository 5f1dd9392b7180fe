"""`rlvr.recipe.staleness`: the warning that says what asynchronous rollout asks of the lr."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlvr.recipe.load import load_recipe
from rlvr.recipe.staleness import MEASURED_LR, delayed_step_factor, max_measured_lr, staleness_warnings

ROOT = Path(__file__).resolve().parents[3]


def quickstart(k: int, lr: float):
    sets = [f"rollout.max_staleness={k}", "algorithm.tis_cap=2.0", f"trainer.lr={lr}"]
    return load_recipe(ROOT / "recipes" / "quickstart.toml", sets)


def test_delayed_gradient_factor() -> None:
    # GD with a k-step delay on a quadratic: lr * h < 2 sin(pi / (4k + 2)); relative to k = 0.
    assert delayed_step_factor(0) == 1.0
    assert delayed_step_factor(1) == pytest.approx(0.5)
    assert delayed_step_factor(2) == pytest.approx((math.sqrt(5) - 1) / 4)
    with pytest.raises(ValueError, match="max_staleness"):
        delayed_step_factor(-1)


def test_limits_measured_and_extrapolated() -> None:
    assert max_measured_lr(0) == math.inf
    for k, lr in MEASURED_LR.items():
        assert max_measured_lr(k) == lr
    beyond = max(MEASURED_LR) + 1
    assert max_measured_lr(beyond) < MEASURED_LR[max(MEASURED_LR)]  # more staleness, smaller step


@pytest.mark.parametrize("k", [1, 2])
def test_quickstart_lr_with_staleness_warns_and_names_keys_and_a_lower_lr(k: int) -> None:
    (line,) = staleness_warnings(quickstart(k, 2e-4))
    assert f"rollout.max_staleness = {k}" in line and "trainer.lr = 0.0002" in line
    assert "lower trainer.lr (to about 0.0001" in line and "rollout.max_staleness = 0" in line
    assert "docs/async.md" in line and "stalled" not in line  # says what to do; the results live in the docs


@pytest.mark.parametrize(("k", "lr"), [(0, 2e-4), (1, 1e-4), (2, 1e-4), (1, 1e-6)])
def test_no_warning_when_synchronous_or_at_a_measured_lr(k: int, lr: float) -> None:
    assert staleness_warnings(quickstart(k, lr)) == []


def test_the_7b_recipe_does_not_warn() -> None:
    assert staleness_warnings(load_recipe(ROOT / "recipes" / "math_code_judge.toml", [])) == []
