"""The update loop shared by actor and critic: rank shares, micro-batches, accumulation, step.

Every rank receives the global batch and takes its own token-balanced share of each mini-batch,
so loss denominators are computed locally and identically, FSDP2 sums gradients, and a 1-rank and
an N-rank run follow the same optimisation path. FSDP2 gathers parameters inside every forward, so
a rank with fewer micro-batches runs zero-weighted dummy ones; under tensor parallel a group's
ranks share rows. docs/trainer.md ("Packing, micro-batches and ranks") has the reasoning.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn

from rlvr.recipe.schema import TrainerConfig
from rlvr.trainer import dist as d
from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.model import attn_implementation_of
from rlvr.trainer.optim import build_optimizer, build_scheduler
from rlvr.trainer.packing import (
    SHARED_PREFIX_IMPLEMENTATION,
    VARLEN_IMPLEMENTATIONS,
    MicroBatch,
    make_micro_batches,
    pack_sequences,
    rank_share,
)
from rlvr.trainer.typed_torch import backward, collectives, optimizer_step

# loss_fn(micro_batch, local_batch, (num_tokens, num_seqs)) -> (loss, metrics, weight); the counts are
# the whole mini-batch's (all ranks), the weight (masked tokens) averages the metrics.
LossFn = Callable[[MicroBatch, TrainBatch, tuple[float, float]], tuple[torch.Tensor, dict[str, float], float]]
# forward_fn(micro_batch) -> [b, width] per-token values (logprobs, values, ...), no grad.
EvalFn = Callable[[MicroBatch], tuple[torch.Tensor, ...]]


@dataclass(slots=True)
class Tally:
    """Local sums of one step's updates' metrics, combined across ranks once by `summarize`."""

    weighted: dict[str, list[float]] = field(default_factory=dict[str, list[float]])  # key -> [sum w*x, sum w]
    losses: list[float] = field(default_factory=list[float])  # local loss sum per update
    grad_norms: list[float] = field(default_factory=list[float])
    lrs: list[float] = field(default_factory=list[float])
    tokens: int = 0
    skipped: int = 0
    start: float = field(default_factory=time.perf_counter)

    maxima: dict[str, float] = field(default_factory=dict[str, float])  # keys ending in "_max"

    def add(self, metrics: dict[str, float], weight: float) -> None:
        for key, value in metrics.items():
            if key.endswith("_max"):
                self.maxima[key] = max(self.maxima.get(key, -math.inf), float(value))
                continue
            acc = self.weighted.setdefault(key, [0.0, 0.0])
            acc[0] += float(value) * weight
            acc[1] += weight


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # musl and others: nothing to trim
        return None


def trim_host_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc's `malloc_trim`; a no-op elsewhere).

    Why, on CPU: glibc keeps freed blocks below its mmap threshold (which rises to 32 MB after
    the first large free) resident, so the first backward's freed activations stay in the RSS
    when Adam allocates its two moments at the first optimizer step. Trimmed just before, the
    first step peaks at the live tensors (358M fp32 model, bench/memory.py: 5.2x -> 4.4x its
    weights). Only there: after every step it lowers only the RSS between steps (5.9x ->
    3.3x), not the later steps' peak (4.70-4.74x vs 4.72-4.78x with checkpointing), and the next
    forward faults its memory in again (about 1 s of a 14 s step at that size). Later steps peak
    higher (6.8-7.3x without checkpointing: the activations, ~2x the weights, beside the grads);
    activation checkpointing is what lowers that (to 4.7-5.0x), see docs/benchmarks.md.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def dummy_batch(pad_id: int) -> TrainBatch:
    """Two pad tokens: the cheapest forward that still touches every parameter."""
    return TrainBatch.from_sequences([[pad_id]], [[pad_id]], pad_id=pad_id)


class ModelTrainer:
    """One model with its optimizer and lr schedule, and the micro-batched update loop."""

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainerConfig,
        *,
        total_steps: int,
        lr: float | None = None,
        device: torch.device | None = None,
        trainable: bool = True,
    ):
        self.model = model
        self.cfg = cfg
        self.device = device or next(model.parameters()).device
        self.attn_implementation = attn_implementation_of(model)
        # only rlvr's packed sdpa reads rlvr_segments (TitanLM reads sequence boundaries itself), and
        # rank shares group by prompt only where micro-batches will share them
        self.share_prompts = (
            cfg.share_prompts
            and self.attn_implementation == SHARED_PREFIX_IMPLEMENTATION
            and not getattr(model, "varlen_only", False)
        )
        # packed rows need an attention that keeps sequences apart by their boundaries (varlen); a
        # family outside the conformance matrix runs on transformers' own masks, hence padded rows
        self.packing = cfg.packing and self.attn_implementation in VARLEN_IMPLEMENTATIONS
        self.optimizer = build_optimizer(model.parameters(), cfg, lr=lr) if trainable else None
        self.scheduler = build_scheduler(self.optimizer, cfg, total_steps=total_steps) if self.optimizer else None
        self.last_update_losses: list[float] = []

    # -- batching -------------------------------------------------------------------------
    @property
    def dp_size(self) -> int:
        return d.world_size() // self.cfg.tp_size

    @property
    def dp_rank(self) -> int:
        return d.rank() // self.cfg.tp_size

    @property
    def counts(self) -> float:
        """1.0 on the rank whose results enter cross-rank sums (the first of its TP group), else 0.0."""
        return 1.0 if d.rank() % self.cfg.tp_size == 0 else 0.0

    def local_share(self, batch: TrainBatch) -> TrainBatch:
        """This rank's rows of a global (mini-)batch, balanced by tokens across data-parallel ranks."""
        return batch if self.dp_size == 1 else batch.select(self._share_index(batch))

    def micro_batches(self, local: TrainBatch) -> list[MicroBatch | None]:
        """Packed (token budget) or padded micro-batches, plus `None` placeholders so every
        rank runs the same number of forwards."""
        mbs: list[MicroBatch | None] = list(
            make_micro_batches(
                local,
                packing=self.packing,
                max_tokens=self.cfg.max_tokens_per_micro_batch,
                micro_batch_size=self.cfg.micro_batch_size,
                attn_implementation=self.attn_implementation,
                share_prompts=self.share_prompts,
            )
        )
        count = int(d.all_reduce([float(len(mbs))], op="max")[0])
        return mbs + [None] * (count - len(mbs))

    def _dummy(self, pad_id: int) -> MicroBatch:
        return pack_sequences(dummy_batch(pad_id), [0], attn_implementation=self.attn_implementation).to(self.device)

    # -- no-grad passes -------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, batch: TrainBatch, fn: EvalFn, *, outputs: int = 1) -> tuple[torch.Tensor, ...]:
        """Run `fn` over every sequence (each rank its share) and return `outputs` global
        `[B, T]` tensors, identical on every rank (one all-reduce; each row has one owner)."""
        was_training = self.model.training
        self.model.eval()
        try:
            share = self._share_index(batch)
            local = batch.select(share)
            results = [torch.zeros(len(batch), batch.max_response_len, dtype=torch.float32) for _ in range(outputs)]
            share_t = torch.as_tensor(share, dtype=torch.long)
            for mb in self.micro_batches(local):
                if mb is None:
                    fn(self._dummy(batch.pad_id))
                    continue
                values = fn(mb.to(self.device))
                rows = share_t[mb.seq_index]
                for out, v in zip(results, values, strict=True):
                    out[rows, : mb.width] = v.detach().float().cpu()
            if d.world_size() > 1:
                results = [self._all_reduce(out * self.counts) for out in results]
            return tuple(results)
        finally:
            self.model.train(was_training)

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        x = t.to(d.comm_device())
        collectives.all_reduce(x)
        return x.cpu()

    def _share_index(self, batch: TrainBatch) -> list[int]:
        if self.dp_size == 1:
            return list(range(len(batch)))
        return rank_share(batch, parts=self.dp_size, rank=self.dp_rank,
                          budget=self.cfg.max_tokens_per_micro_batch, share_prompts=self.share_prompts)  # fmt: skip

    # -- updates --------------------------------------------------------------------------
    def update(self, mini: TrainBatch, loss_fn: LossFn, tally: Tally) -> None:
        """One optimizer step on a global mini-batch: this rank's micro-batches, accumulate,
        clip, step, schedule."""
        from rlvr.algorithms.losses import loss_denominators

        assert self.optimizer is not None and self.scheduler is not None
        denominators = loss_denominators(mini.response_mask)  # global: every rank holds the mini-batch
        local = self.local_share(mini)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for mb in self.micro_batches(local):
            if mb is None:
                dummy = self._dummy(mini.pad_id)
                out = self.model(**dummy.model_kwargs())
                backward(out.logits.sum() * 0.0)
                continue
            mb = mb.to(self.device)
            loss, metrics, weight = loss_fn(mb, local, denominators)
            backward(loss)
            loss_sum += float(loss.detach())
            tally.add(metrics, weight)
            tally.tokens += mb.num_tokens
        grad_norm = self.clip_grad_norm()
        tally.lrs.append(self.optimizer.param_groups[0]["lr"])
        if math.isfinite(grad_norm):
            if self.device.type == "cpu" and not self.optimizer.state:
                trim_host_heap()  # Adam allocates its moments now (see trim_host_heap)
            optimizer_step(self.optimizer)
        else:  # one bad batch must not poison the weights; the step is counted and reported
            tally.skipped += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        tally.losses.append(loss_sum)
        tally.grad_norms.append(grad_norm)

    def clip_grad_norm(self) -> float:
        """Global grad norm over all (sharded) parameters, clipped to `grad_clip` when > 0.

        DTensor grads give a DTensor norm; `full_tensor()` completes the cross-rank reduction
        so every rank clips with the same factor.
        """
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if d.is_dtensor(total):
            total = total.full_tensor()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), self.cfg.grad_clip, total)
        return float(total)

    def summarize(self, tally: Tally) -> dict[str, float]:
        """A step's metrics averaged over updates and ranks: loss-function metrics weighted by each
        micro-batch's masked tokens; `loss` is each update's global mini-batch loss (the sum over
        ranks and micro-batches, which the global denominators make the true mean), averaged."""
        elapsed = time.perf_counter() - tally.start
        keys, max_keys = sorted(tally.weighted), sorted(tally.maxima)
        if d.world_size() > 1:  # a rank that ran only dummy micro-batches has no keys
            gathered: list[tuple[list[str], list[str]] | None] = [None] * d.world_size()
            collectives.all_gather_object(gathered, (keys, max_keys))
            every = cast("list[tuple[list[str], list[str]]]", gathered)  # filled: every rank's pair
            keys = sorted({k for ks, _ in every for k in ks})
            max_keys = sorted({k for _, ks in every for k in ks})
        maxima = d.all_reduce([tally.maxima.get(k, -math.inf) for k in max_keys], op="max")
        flat = [v for k in keys for v in tally.weighted.get(k, [0.0, 0.0])]
        flat += tally.losses + [float(tally.tokens)]
        flat = d.all_reduce([v * self.counts for v in flat], op="sum")
        elapsed = d.all_reduce([elapsed], op="max")[0]
        n = len(tally.losses)
        losses = flat[2 * len(keys) : 2 * len(keys) + n]
        self.last_update_losses = losses
        metrics = {k: flat[2 * i] / flat[2 * i + 1] if flat[2 * i + 1] > 0 else 0.0 for i, k in enumerate(keys)}
        metrics.update(zip(max_keys, maxima, strict=True))
        metrics["loss"] = sum(losses) / max(1, n)
        metrics["grad_norm"] = sum(tally.grad_norms) / max(1, n)
        metrics["lr"] = tally.lrs[-1] if tally.lrs else 0.0
        metrics["tokens_per_s"] = flat[-1] / elapsed if elapsed > 0 else 0.0
        metrics["updates"] = float(n)
        if tally.skipped:
            metrics["skipped_updates"] = float(tally.skipped)
        return metrics


class TrainerHandles:
    """`model`, `optimizer`, `scheduler` of a part's trainable `engine`: what checkpoints and sync use."""

    trainer: ModelTrainer

    @property
    def model(self) -> nn.Module:
        return self.trainer.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        assert self.trainer.optimizer is not None
        return self.trainer.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        assert self.trainer.scheduler is not None
        return self.trainer.scheduler
