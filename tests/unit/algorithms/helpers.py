"""Shared test helpers: a config namespace with every knob, built from the real BASE preset."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rlvr.recipe.presets import BASE


def cfg(**overrides: Any) -> SimpleNamespace:
    """All knobs at their BASE values (kl off, ppo_clip 0.2/0.2, token-mean) plus overrides."""
    return SimpleNamespace(**{**BASE, **overrides})
