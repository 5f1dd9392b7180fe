"""Tiny random-weight configs of every family in the conformance matrix (`rlvr.recipe.families`).

Each switches on, at a small size, what makes its family differ from Llama: a sliding window of
WINDOW tokens (shorter than the test sequences, so it bites), soft-capping, attention sinks, NoPE
layers, MoE routing, q/k norms, post-norms, local and global rope, multipliers. fp32 throughout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

WINDOW = 8
BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}
SLIDING = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}

CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": WINDOW},
    "qwen2": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2},
    "qwen3": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2},
    "qwen3_moe": {**MOE, "decoder_sparse_step": 1, "norm_topk_prob": True},
    "gemma": {"hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": True},
    "gemma2": {
        "sliding_window": WINDOW, "layer_types": SLIDING, "attn_logit_softcapping": 2.0,
        "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 24, "tie_word_embeddings": True,
    },
    "gemma3_text": {
        "sliding_window": WINDOW, "layer_types": SLIDING, "query_pre_attn_scalar": 24, "tie_word_embeddings": True,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    },
    "phi3": {"sliding_window": WINDOW},
    "olmo2": {},
    "granite": {
        "embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.2, "logits_scaling": 4.0,
    },
    "smollm3": {"no_rope_layer_interval": 2, "use_sliding_window": True, "sliding_window": WINDOW,
                "max_window_layers": 2},
    "gpt_oss": {
        "num_local_experts": 4, "num_experts_per_tok": 2, "layer_types": SLIDING, "sliding_window": WINDOW,
        "intermediate_size": 32,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "rope_theta": 150_000.0, "original_max_position_embeddings": 64},
    },
    "deepseek_v3": {
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
        "moe_intermediate_size": 32, "n_shared_experts": 1, "q_lora_rank": 32, "kv_lora_rank": 16,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "num_key_value_heads": 4, "head_dim": 8,
    },
}  # fmt: skip


def tiny_config(model_type: str, *, vocab_size: int) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **{**BASE, "vocab_size": vocab_size, **CONFIGS[model_type]})
    config.use_cache = False
    return config


def build_folder(model_type: str, root: Path, *, seed: int = 0) -> Path:
    """A saved model folder of the family's tiny config, random weights from `seed` (once per root)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.tiny import build_char_tokenizer

    out = root / model_type
    if (out / "config.json").is_file():
        return out
    tokenizer = build_char_tokenizer()  # the engine needs one; ids 0-2 are pad, eos, bos
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, vocab_size=len(tokenizer)), dtype=torch.float32)
    _spread(model, seed=seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _spread(model: Any, *, seed: int) -> None:
    """Random weights large enough that a wrong mask, cap or sink shows: transformers initialises
    norms to one, biases and sinks to zero, and projections small (std 0.02), so attention is
    near-uniform and a dropped feature can hide below the tolerance."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=g) * (0.6 / param.shape[-1] ** 0.5))
            elif "norm" in name or "layernorm" in name:
                param.add_(torch.randn(param.shape, generator=g) * 0.1)
            else:  # biases, sinks, router biases
                param.copy_(torch.randn(param.shape, generator=g) * 0.5)
