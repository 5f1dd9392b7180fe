"""The policy: its sharded model and optimizer, a frozen reference, and their log-prob forwards.

The updates and the loss that uses these forwards are in rlvr/trainer/step.py.
"""

from __future__ import annotations

import torch
from torch import nn

from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from rlvr.trainer import dist as d
from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.forward import EntropyMode, token_logprobs
from rlvr.trainer.model import build_model
from rlvr.trainer.model_trainer import ModelTrainer, TrainerHandles
from rlvr.trainer.packing import MicroBatch


class Actor(TrainerHandles):
    """Policy model + optimizer (+ frozen reference model when the algorithm uses KL)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        trainer: TrainerConfig,
        algorithm: AlgorithmConfig,
        total_steps: int,
        reference: nn.Module | None = None,
        temperature: float = 1.0,
        max_response_len: int | None = None,
    ):
        """`total_steps` counts optimizer steps (RL steps x ppo_epochs x mini_batches) for the
        lr schedule. `temperature` is the rollout's sampling temperature (logits are divided by
        it). `max_response_len` is Dr.GRPO's constant normaliser (`rollout.max_new_tokens`);
        None uses the batch's response width."""
        self.trainer = ModelTrainer(model, trainer, total_steps=total_steps)
        self.reference = ModelTrainer(reference, trainer, total_steps=1, trainable=False) if reference else None
        self.trainer_config = trainer
        self.algorithm = algorithm
        self.temperature = temperature
        self.max_response_len = max_response_len
        self.chunk_tokens = trainer.logits_chunk_tokens

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
        temperature: float = 1.0,
        max_response_len: int | None = None,
    ) -> Actor:
        """Load and shard the policy, and a frozen reference copy when `algorithm.kl_in != "none"`
        (none with LoRA: the reference is the policy's own base, adapters off)."""
        if device is None:
            device = d.init_distributed(force=trainer.strategy == "fsdp2").device
        model = build_model(model_cfg, trainer, device=device, seed=seed)
        reference = None
        if algorithm.needs_reference and not trainer.lora.enabled:  # LoRA: the base, adapters off
            reference = build_model(model_cfg, trainer, device=device, seed=seed, trainable=False)
        return cls(
            model,
            trainer=trainer,
            algorithm=algorithm,
            total_steps=total_steps,
            reference=reference,
            temperature=temperature,
            max_response_len=max_response_len,
        )

    # -- no-grad passes ------------------------------------------------------------------------
    def compute_logprobs(self, batch: TrainBatch, *, reference: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(logprobs, entropy), each [B, T] on CPU, 0 past each response; every rank gets all rows.

        `reference=True` runs the frozen reference model instead (KL in reward or loss); with LoRA,
        the policy's base with its adapters off.
        """
        base = reference and self.trainer_config.lora.enabled
        engine = self.trainer if base or not reference else self.reference
        if engine is None:
            raise ValueError("no reference model: the algorithm has kl_in = 'none'")

        def fn(mb: MicroBatch) -> tuple[torch.Tensor, ...]:
            logp, ent = token_logprobs(
                engine.model, mb, temperature=self.temperature, entropy="detached", chunk_tokens=self.chunk_tokens
            )
            assert ent is not None
            return logp, ent

        if not base:
            return engine.evaluate(batch, fn, outputs=2)  # pyright: ignore[reportReturnType]
        from rlvr.trainer.lora import adapters_disabled

        with adapters_disabled(engine.model):
            return engine.evaluate(batch, fn, outputs=2)  # pyright: ignore[reportReturnType]

    def token_logprobs(self, mb: MicroBatch, *, entropy: EntropyMode) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The training forward of a micro-batch: log-probs with grad, at the rollout's temperature."""
        return token_logprobs(
            self.trainer.model, mb, temperature=self.temperature, entropy=entropy, chunk_tokens=self.chunk_tokens
        )
