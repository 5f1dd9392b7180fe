"""Shared test helpers: an `AlgorithmConfig` with every knob, built from the real BASE preset."""

from __future__ import annotations

from typing import Any

from rlvr.recipe.presets import BASE
from rlvr.recipe.schema import AlgorithmConfig


def cfg(**overrides: Any) -> AlgorithmConfig:
    """All knobs at their BASE values (kl off, ppo_clip 0.2/0.2, token-mean) plus overrides.

    Built without validation, so a test can hand the algorithms a combination the recipe refuses
    (and check that they refuse it too)."""
    return AlgorithmConfig.model_construct(**{**BASE, **overrides})
