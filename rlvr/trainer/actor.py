"""The policy: old/reference log-probs, and PPO-style updates with any `rlvr.algorithms` loss.

`Actor.train_step(batch)` is one RL step's worth of optimisation: `ppo_epochs` passes over
the batch, each split into `mini_batches` optimizer steps, each accumulated over packed
(or padded) micro-batches on every rank with the global loss denominators. Every rank
receives the same global `TrainBatch` (see `rlvr.trainer.engine`).
"""

from __future__ import annotations

import torch
from torch import nn

from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from rlvr.trainer import dist as d
from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.engine import EngineHandles, TrainEngine
from rlvr.trainer.forward import token_logprobs
from rlvr.trainer.model import build_model
from rlvr.trainer.packing import MicroBatch, slice_rows


class Actor(EngineHandles):
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
        self.engine = TrainEngine(model, trainer, total_steps=total_steps)
        self.reference = TrainEngine(reference, trainer, total_steps=1, trainable=False) if reference else None
        self.trainer = trainer
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
        base = reference and self.trainer.lora.enabled
        engine = self.engine if base or not reference else self.reference
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

    def compute_ref_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.compute_logprobs(batch, reference=True)[0]

    def prepare(self, batch: TrainBatch, *, pi_old_from_forward: bool = False) -> TrainBatch:
        """Fill what the loss needs and the batch lacks: pi_old (recomputed by the trainer) and,
        for KL in the loss, the reference log-probs.

        With `pi_old_from_forward` (one update per batch) pi_old is not recomputed: the weights
        have not moved yet, so the training forward's own log-probs, detached, are pi_old, on- or
        off-policy (decoupled PPO's proximal policy is the current weights).
        """
        if batch.old_logprobs is None and not pi_old_from_forward:
            batch = batch.replace(old_logprobs=self.compute_logprobs(batch)[0])
        if self.algorithm.kl_in == "loss" and batch.ref_logprobs is None:
            batch = batch.replace(ref_logprobs=self.compute_ref_logprobs(batch))
        return batch

    # -- training -------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch, *, kl_coef: float | None = None) -> dict[str, float]:
        """ppo_epochs x mini_batches optimizer steps on this global batch; metrics averaged over
        updates and ranks (loss, grad_norm, lr, tokens_per_s, clip_frac, kl, entropy, ...).

        `kl_coef` overrides `algorithm.kl_coef` (the adaptive controller's current value).
        Without `batch.old_logprobs`, pi_old is recomputed first, except for a single update
        (ppo_epochs = mini_batches = 1), where it is the training forward's detached output.
        """
        from rlvr.algorithms.losses import compute_policy_loss

        alg = self.algorithm
        epochs, mini_batches = alg.ppo_epochs, alg.mini_batches
        from_forward = batch.old_logprobs is None and epochs * mini_batches == 1
        batch = self.prepare(batch, pi_old_from_forward=from_forward)
        entropy_mode = "grad" if alg.entropy_coef != 0.0 else "detached"
        max_len = self.max_response_len or batch.max_response_len

        def loss_fn(
            mb: MicroBatch, local: TrainBatch, counts: tuple[float, float]
        ) -> tuple[torch.Tensor, dict[str, float], float]:
            logp, ent = token_logprobs(
                self.engine.model,
                mb,
                temperature=self.temperature,
                entropy=entropy_mode,
                chunk_tokens=self.chunk_tokens,
            )
            dev = logp.device

            def field(t: torch.Tensor | None) -> torch.Tensor | None:
                return slice_rows(t, mb).to(dev) if t is not None else None

            mask = field(local.response_mask)
            assert mask is not None
            num_tokens, num_seqs = counts
            loss, metrics = compute_policy_loss(
                cfg=alg,
                logprobs=logp,
                old_logprobs=logp.detach() if from_forward else field(local.old_logprobs),  # pyright: ignore[reportArgumentType]
                advantages=field(local.advantages),  # pyright: ignore[reportArgumentType]
                mask=mask,
                ref_logprobs=field(local.ref_logprobs),
                rollout_logprobs=field(local.rollout_logprobs),
                entropy=ent,
                kl_coef=kl_coef,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                max_len=max_len,
            )
            metrics.pop("loss", None)  # micro-batch-local; the engine reports the global one
            return loss, metrics, float(mask.sum())

        return self.engine.run(batch, loss_fn, epochs=epochs, mini_batches=mini_batches)
