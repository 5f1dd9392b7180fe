"""Trainer fixtures: a tiny model folder, a length-skewed synthetic batch, single-process actors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def make_batch(n: int = 6, *, seed: int = 0, max_prompt: int = 10, max_response: int = 20):
    from rlvr.trainer.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(4, 90, (int(k),), generator=g).tolist() for k in torch.randint(1, max_prompt, (n,), generator=g)
    ]
    responses = [
        torch.randint(4, 90, (int(k),), generator=g).tolist() for k in torch.randint(1, max_response, (n,), generator=g)
    ]
    advantages = torch.randn(n, generator=g).tolist()
    return TrainBatch.from_sequences(prompts, responses, advantages=advantages, group_ids=[i // 2 for i in range(n)])


@pytest.fixture
def batch():
    return make_batch()


def build_actor(model_dir: Path, *, preset: str = "grpo", **trainer_kwargs):
    from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
    from rlvr.trainer.actor import Actor

    trainer = TrainerConfig(**{"strategy": "none", "lr": 1e-3, **trainer_kwargs})
    return Actor.build(
        ModelConfig(path=str(model_dir)), trainer, AlgorithmConfig(preset=preset), total_steps=10,
        device=torch.device("cpu"),
    )  # fmt: skip
