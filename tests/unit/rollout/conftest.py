"""Fixtures for rollout tests: a tiny Qwen3 whose weights are scaled up so greedy text varies.

A freshly initialised tiny model has near-uniform logits and greedily repeats one
character; multiplying its matrices makes outputs diverse, so tests that compare
batching schedules or weight versions compare something meaningful.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import build_sharp_model_dir


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sharp_model_dir(tmp_path_factory.mktemp("rollout") / "sharp")
