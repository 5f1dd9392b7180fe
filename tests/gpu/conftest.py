"""GPU tests: marked `gpu`, deselected by default (`pytest -m gpu tests/gpu` runs them), and
skipped with a reason when CUDA is not available."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
