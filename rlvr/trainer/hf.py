"""The transformers model a `ModelConfig` names: its config (`load_hf_config`) and the model itself in
fp32 on CPU (`load_hf_model`).

Both implementations start here: `rlvr.trainer.model` loads the transformers model and shards it,
and `rlvr.trainer.titan` reads the same config for torchtitan's decoder and takes its starting
weights from the same model when `model.path` has none to give.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import nn

from rlvr.recipe.schema import ModelConfig
from rlvr.trainer.typed_torch import manual_seed

if TYPE_CHECKING:
    from transformers import PreTrainedConfig


class _AutoConfig(Protocol):
    """What rlvr calls of `AutoConfig` (transformers leaves its keyword arguments unannotated)."""

    def from_pretrained(self, path: str, /, *, trust_remote_code: bool) -> PreTrainedConfig: ...

    def for_model(self, model_type: str, /, **kwargs: object) -> PreTrainedConfig: ...


class _AutoModel(Protocol):
    """What rlvr calls of `AutoModelForCausalLM` / `AutoModelForTokenClassification`."""

    def from_pretrained(self, path: str, /, **kwargs: object) -> nn.Module: ...

    def from_config(self, config: PreTrainedConfig, /, **kwargs: object) -> nn.Module: ...


def load_hf_config(cfg: ModelConfig, **overrides: object) -> PreTrainedConfig:
    """The transformers config of `model.path` (or of `model.config`), with `overrides` set on it."""
    from transformers import AutoConfig

    auto = cast(_AutoConfig, AutoConfig)
    if cfg.path is not None:
        config = auto.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)
    else:
        assert cfg.config is not None
        raw = dict(cfg.config)
        config = auto.for_model(raw.pop("model_type"), **raw)
    for key, value in overrides.items():
        setattr(config, key, value)
    config.use_cache = False  # training never decodes; a cache only costs memory
    return config


def load_hf_model(
    cfg: ModelConfig, *, kind: str = "causal_lm", seed: int = 0, attn_implementation: str | None = "rlvr_packed"
) -> nn.Module:
    """A transformers model in fp32 on CPU: `kind="causal_lm"` (actor, reference) or `"value"`.

    `attn_implementation`: `rlvr_packed` (varlen sdpa, see `rlvr.trainer.attention`),
    `flash_attention_2`, plain `sdpa` / `eager` (packed rows then get a 4D mask), or None: transformers'
    own choice.

    The value model is `AutoModelForTokenClassification(num_labels=1)`: the same backbone
    loaded from the policy's weights plus a fresh scalar head (`score`), dropout off so
    values are deterministic. A model built from `cfg.config` is seeded with `seed` so every
    rank starts from identical weights.
    """
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    import rlvr.trainer.attention  # noqa: F401  # pyright: ignore[reportUnusedImport]  # registers rlvr_packed

    extra: dict[str, object] = {}
    auto = cast(_AutoModel, AutoModelForCausalLM)
    if kind == "value":
        auto = cast(_AutoModel, AutoModelForTokenClassification)
        extra = {"num_labels": 1, "classifier_dropout": 0.0}
    elif kind != "causal_lm":
        raise ValueError(f"unknown model kind {kind!r}")
    config = load_hf_config(cfg, **extra)
    common = {"dtype": torch.float32, "attn_implementation": attn_implementation}
    if cfg.path is not None:
        manual_seed(seed)  # the value head is freshly initialised: same on every rank
        model = auto.from_pretrained(cfg.path, config=config, trust_remote_code=cfg.trust_remote_code, **common)
    else:
        manual_seed(seed)
        model = auto.from_config(config, trust_remote_code=cfg.trust_remote_code, **common)
    return model
