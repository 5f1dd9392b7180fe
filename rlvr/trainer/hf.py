"""The transformers model a `ModelConfig` names: its config (`load_hf_config`) and the model itself in
fp32 on CPU (`load_hf_model`).

Both implementations start here: `rlvr.trainer.model` loads the transformers model and shards it,
and `rlvr.trainer.titan` reads the same config for torchtitan's decoder and takes its starting
weights from the same model when `model.path` has none to give.
"""

from __future__ import annotations

import torch
from torch import nn

from rlvr.recipe.schema import ModelConfig


def load_hf_config(cfg: ModelConfig, **overrides: object):
    """The transformers config of `model.path` (or of `model.config`), with `overrides` set on it."""
    from transformers import AutoConfig

    if cfg.path is not None:
        config = AutoConfig.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)
    else:
        assert cfg.config is not None
        raw = dict(cfg.config)
        config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    for key, value in overrides.items():
        setattr(config, key, value)
    config.use_cache = False  # training never decodes; a cache only costs memory
    return config


def load_hf_model(
    cfg: ModelConfig, *, kind: str = "causal_lm", seed: int = 0, attn_implementation: str = "rlvr_packed_sdpa"
) -> nn.Module:
    """A transformers model in fp32 on CPU: `kind="causal_lm"` (actor, reference) or `"value"`.

    `attn_implementation`: `rlvr_packed_sdpa` (varlen sdpa, see `rlvr.trainer.attention`),
    `flash_attention_2`, or plain `sdpa` / `eager` (packed rows then get a 4D mask).

    The value model is `AutoModelForTokenClassification(num_labels=1)`: the same backbone
    loaded from the policy's weights plus a fresh scalar head (`score`), dropout off so
    values are deterministic. A model built from `cfg.config` is seeded with `seed` so every
    rank starts from identical weights.
    """
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    extra: dict[str, object] = {}
    auto: type = AutoModelForCausalLM
    if kind == "value":
        auto = AutoModelForTokenClassification
        extra = {"num_labels": 1, "classifier_dropout": 0.0}
    elif kind != "causal_lm":
        raise ValueError(f"unknown model kind {kind!r}")
    config = load_hf_config(cfg, **extra)
    common = {"dtype": torch.float32, "attn_implementation": attn_implementation}
    if cfg.path is not None:
        torch.manual_seed(seed)  # the value head is freshly initialised: same on every rank
        model = auto.from_pretrained(cfg.path, config=config, trust_remote_code=cfg.trust_remote_code, **common)
    else:
        torch.manual_seed(seed)
        model = auto.from_config(config, trust_remote_code=cfg.trust_remote_code, **common)
    return model
