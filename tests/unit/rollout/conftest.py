"""Fixtures for rollout tests: a tiny Qwen3 whose weights are scaled up so greedy text varies.

A freshly initialised tiny model has near-uniform logits and greedily repeats one
character; multiplying its matrices makes outputs diverse, so tests that compare
batching schedules or weight versions compare something meaningful.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def build_sharp_model_dir(path: Path, *, scale: float = 6.0, seed: int = 0) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.tiny import build_tiny_model_dir

    if (path / "config.json").exists():
        return path
    base = build_tiny_model_dir(path.with_name(path.name + "-base"), seed=seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.mul_(scale)
    model.save_pretrained(path)
    for file in base.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, path / file.name)
    return path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sharp_model_dir(tmp_path_factory.mktemp("rollout") / "sharp")
