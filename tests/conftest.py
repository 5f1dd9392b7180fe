"""Shared fixtures: a tiny model folder built once per session (nothing is downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs every property test with fixed seeds: a red CI must mean a change broke something,
# not that a new random example turned up (run locally without CI=1 to keep exploring).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rlvr.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny", seed=0)
