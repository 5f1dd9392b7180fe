"""The value model for PPO/GAE: the policy's backbone plus a scalar head, trained on returns.

`AutoModelForTokenClassification(num_labels=1)` loads the backbone weights from the policy
folder and adds a fresh `score` head; it shards, packs and checkpoints exactly like the
actor because it goes through the same `TrainEngine`.
"""

from __future__ import annotations

import torch
from torch import nn

from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from rlvr.trainer import dist as d
from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.engine import EngineHandles, TrainEngine
from rlvr.trainer.forward import token_values
from rlvr.trainer.model import build_model
from rlvr.trainer.packing import MicroBatch, slice_rows


class Critic(EngineHandles):
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
        self.engine = TrainEngine(model, trainer, total_steps=total_steps, lr=algorithm.critic_lr)
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
        (values,) = self.engine.evaluate(batch, lambda mb: (token_values(self.engine.model, mb),), outputs=1)
        return values

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Clipped value regression on `batch.returns` (old values recomputed if missing);
        metrics: vf_loss, vf_clip_frac, value_mean, returns_mean, loss, grad_norm, lr, ..."""
        from rlvr.algorithms.losses import compute_value_loss

        if batch.returns is None:
            raise ValueError("critic.train_step needs batch.returns (from compute_advantages)")
        if batch.old_values is None:
            batch = batch.replace(old_values=self.compute_values(batch))
        alg = self.algorithm
        max_len = self.max_response_len or batch.max_response_len

        def loss_fn(
            mb: MicroBatch, local: TrainBatch, counts: tuple[float, float]
        ) -> tuple[torch.Tensor, dict[str, float], float]:
            values = token_values(self.engine.model, mb)
            dev = values.device
            assert local.old_values is not None and local.returns is not None
            mask = slice_rows(local.response_mask, mb).to(dev)
            loss, metrics = compute_value_loss(
                values=values,
                old_values=slice_rows(local.old_values, mb).to(dev),
                returns=slice_rows(local.returns, mb).to(dev),
                mask=mask,
                value_clip=float(alg.value_clip),
                mode=str(alg.loss_agg),
                num_tokens=counts[0],
                num_seqs=counts[1],
                max_len=max_len,
            )
            return loss, metrics, float(mask.sum())

        return self.engine.run(batch, loss_fn, epochs=alg.ppo_epochs, mini_batches=alg.mini_batches)
