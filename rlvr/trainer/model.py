"""Load a transformers model (`rlvr.trainer.hf`) and shard it with FSDP2 (`fully_shard` per decoder block + root).

One path for every model the trainer holds (actor, frozen reference, critic), so they are
sharded the same way and a reference forward costs what an actor forward costs. On CPU we
train in fp32 (bf16 measured 2-11x slower on 2-core CPUs) and gloo carries the
collectives; on GPU FSDP2's MixedPrecisionPolicy computes in `trainer.param_dtype` over fp32
master weights and reduces gradients in `trainer.reduce_dtype`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import nn

from rlvr.recipe.schema import ModelConfig, TrainerConfig
from rlvr.trainer import dist as d
from rlvr.trainer.attention import default_attn_implementation
from rlvr.trainer.hf import load_hf_config, load_hf_model
from rlvr.weight_arena import build_weight_arena

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks: what FSDP2 shards one by one (and checkpointing wraps)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if isinstance(layers, nn.ModuleList):
            blocks = list(layers)
    if not blocks:
        raise ValueError(f"cannot find the decoder blocks of {type(model).__name__} to shard")
    return blocks


def shard_model(
    model: nn.Module,
    *,
    strategy: str,
    device: torch.device,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    gradient_checkpointing: bool = False,
) -> nn.Module:
    """Move to `device` and apply FSDP2 (strategy "fsdp2") or leave a plain module ("none").

    Gradients are *summed* across ranks (divide factor 1): the losses already divide by
    global token/sequence counts, so a sum is the full-batch gradient. gloo has no
    PREMUL_SUM/AVG reduce-scatter, so comms are forced to plain sums there.
    """
    if gradient_checkpointing:
        # transformers 5 renamed it; non-reentrant checkpointing is the one FSDP2 supports
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        elif (legacy := getattr(model, "gradient_checkpointing_enable", None)) is not None:
            legacy(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            raise ValueError(f"{type(model).__name__} supports no activation checkpointing")
    model.to(device)
    if strategy == "none":
        if d.world_size() > 1:
            raise ValueError("trainer.strategy = 'none' runs on one process; use 'fsdp2' with torchrun")
        build_weight_arena(model)  # weight sync then sends flattened buckets from where they lie
        return model
    if strategy != "fsdp2":
        raise ValueError(f"unknown trainer strategy {strategy!r}")
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    d.init_distributed(force=True)
    # CPU: the default policy (no casts); fp32 throughout
    on_gpu = device.type == "cuda"
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype) if on_gpu else MixedPrecisionPolicy()
    for block in decoder_blocks(model):
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    gloo = torch.distributed.get_backend() == "gloo"
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if gloo:
                module.set_force_sum_reduction_for_comms(True)
    return model


def build_model(
    cfg: ModelConfig,
    trainer: TrainerConfig,
    *,
    device: torch.device,
    kind: str = "causal_lm",
    seed: int = 0,
    trainable: bool = True,
    attn_implementation: str | None = None,
) -> nn.Module:
    """Load + shard in one call. A frozen model (`trainable=False`, the reference) gets no
    gradients and no activation checkpointing; it is sharded like the actor. With `trainer.lora` a
    causal LM gets its adapters (`rlvr.trainer.lora`), trainable or not (a checkpoint holds them).

    `model.impl = "torchtitan"` builds torchtitan's decoder instead (`rlvr.trainer.titan`)."""
    if cfg.impl == "torchtitan":
        from rlvr.trainer.titan import build_titan_model

        model = build_titan_model(cfg, trainer, device=device, kind=kind, seed=seed, trainable=trainable)
        if not trainable:
            model.requires_grad_(False)
        model.train(trainable)
        return model
    attn = attn_implementation or default_attn_implementation(device, model_type=load_hf_config(cfg).model_type)
    model = load_hf_model(cfg, kind=kind, seed=seed, attn_implementation=attn)
    if trainer.lora.enabled and kind == "causal_lm":  # the policy; the critic trains in full
        from rlvr.trainer.lora import apply_lora

        model = apply_lora(model, trainer.lora, seed=seed)
    if not trainable:
        model.requires_grad_(False)
    model.train(trainable)  # dropout is 0 in the configs we load; train() keeps checkpointing active
    on_gpu = device.type == "cuda"
    return shard_model(
        model,
        strategy=trainer.strategy,
        device=device,
        param_dtype=DTYPES[trainer.param_dtype] if on_gpu else None,
        reduce_dtype=DTYPES[trainer.reduce_dtype] if on_gpu else None,
        gradient_checkpointing=(cfg.gradient_checkpointing or trainer.activation_checkpointing == "full") and trainable,
    )


def attn_implementation_of(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "sdpa")


class _AutoTokenizer(Protocol):
    """What rlvr calls of `AutoTokenizer` (transformers leaves its arguments unannotated)."""

    def from_pretrained(self, path: str, /, *, trust_remote_code: bool) -> PreTrainedTokenizerBase: ...


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase | None:
    """The tokenizer folder (`model.tokenizer`, else `model.path`); None for a config-only model."""
    source = cfg.tokenizer or cfg.path
    if source is None:
        return None
    from transformers import AutoTokenizer

    return cast(_AutoTokenizer, AutoTokenizer).from_pretrained(source, trust_remote_code=cfg.trust_remote_code)
