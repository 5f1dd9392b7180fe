"""The value model for PPO/GAE: the policy's backbone plus a scalar head, trained on returns
(the value loss is in rlvr/trainer/step.py).

`AutoModelForTokenClassification(num_labels=1)` loads the backbone weights from the policy
folder and adds a fresh `score` head; it shards, packs and checkpoints exactly like the
actor because it goes through the same `ModelTrainer`.
"""

from __future__ import annotations

import torch
from torch import nn

from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from rlvr.trainer import dist as d
from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.forward import token_values
from rlvr.trainer.model import build_model
from rlvr.trainer.model_trainer import ModelTrainer, TrainerHandles
from rlvr.trainer.packing import MicroBatch


class Critic(TrainerHandles):
    """Value model + its own AdamW (lr = `algorithm.critic_lr`)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        trainer: TrainerConfig,
        algorithm: AlgorithmConfig,
        total_steps: int,
        max_response_len: int | None = None,
    ):
        self.trainer = ModelTrainer(model, trainer, total_steps=total_steps, lr=algorithm.critic_lr)
        self.algorithm = algorithm
        self.max_response_len = max_response_len

    @classmethod
    def build(
        cls,
        model_cfg: ModelConfig,
        trainer: TrainerConfig,
        algorithm: AlgorithmConfig,
        *,
        total_steps: int,
        device: torch.device | None = None,
        seed: int = 0,
        max_response_len: int | None = None,
    ) -> Critic:
        if device is None:
            device = d.init_distributed(force=trainer.strategy == "fsdp2").device
        model = build_model(model_cfg, trainer, device=device, kind="value", seed=seed)
        return cls(
            model, trainer=trainer, algorithm=algorithm, total_steps=total_steps, max_response_len=max_response_len
        )

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """V before each response token, [B, T] on CPU (0 past each response), on every rank."""
        (values,) = self.trainer.evaluate(batch, lambda mb: (self.token_values(mb),), outputs=1)
        return values

    def token_values(self, mb: MicroBatch) -> torch.Tensor:
        """V before each token of a micro-batch, with grad: the value loss's forward."""
        return token_values(self.trainer.model, mb)
