"""`rlvr plan`'s estimated memory terms against what CUDA allocates (the exact terms are checked
on CPU in tests/unit/recipe/test_memory.py): one micro-batch's activations, with and without
activation checkpointing, and the embedded engine's KV cache, each within 15% of
torch.cuda.max_memory_allocated. Run on a GPU machine: `pytest -m gpu tests/gpu`."""

from __future__ import annotations

from typing import Any

import pytest

from rlvr.recipe.memory import ModelShape, activation_bytes, llama_tensors

pytestmark = pytest.mark.gpu

TOLERANCE = 0.15
CONFIG = {
    "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
    "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # fmt: skip
TOKENS = 4096


def shape() -> ModelShape:
    return ModelShape(
        tensors=llama_tensors(CONFIG), hidden=1024, layers=4, heads=16, kv_heads=4, head_dim=64,
        intermediate=2816, vocab=32000, positions=4096,
    )  # fmt: skip


def measured_activations(*, checkpointing: bool) -> int:
    """Peak bytes of a bf16 forward + backward of TOKENS tokens' log-probs (as
    rlvr.trainer.forward computes them), above the weights and less their gradients."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**CONFIG), attn_implementation="sdpa")
    model = model.to("cuda", torch.bfloat16).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, CONFIG["vocab_size"], (1, TOKENS), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    logits = model(input_ids=ids, use_cache=False).logits.reshape(-1, CONFIG["vocab_size"]).float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids.reshape(-1, 1)).sum()
    logp.backward()
    torch.cuda.synchronize()
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    return torch.cuda.max_memory_allocated() - base - grads


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_activation_estimate_is_within_15_percent_of_cuda(checkpointing: bool) -> None:
    measured = measured_activations(checkpointing=checkpointing)
    estimated = activation_bytes(shape(), tokens=TOKENS, compute=2, checkpointing=checkpointing)
    print(f"activations ({'checkpointed' if checkpointing else 'plain'}): estimated {estimated / 2**20:.0f} MiB, "
          f"measured {measured / 2**20:.0f} MiB, ratio {estimated / measured:.3f}")  # fmt: skip
    assert abs(estimated - measured) <= TOLERANCE * measured


def test_embedded_kv_cache_estimate_is_within_15_percent_of_cuda(tiny_model_dir) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.recipe.memory import ModelShape as Shape
    from rlvr.recipe.memory import safetensors_shapes
    from rlvr.server.decoders import StaticKVDecoder

    loaded: Any = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    model = loaded.to("cuda").eval()
    config = model.config
    heads = int(config.num_attention_heads)
    tiny = Shape(
        tensors=safetensors_shapes(tiny_model_dir), hidden=int(config.hidden_size), layers=int(config.num_hidden_layers),
        heads=heads, kv_heads=int(config.num_key_value_heads or heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        intermediate=int(config.intermediate_size), vocab=int(config.vocab_size), positions=512,
    )  # fmt: skip
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    decoder = StaticKVDecoder(model, max_slots=16, max_len=512)
    torch.cuda.synchronize()
    kv = sum(t.numel() * t.element_size() for t in (decoder.k_cache, decoder.v_cache))
    estimated = tiny.kv_bytes_per_token(dtype_bytes=2) * 16 * 512
    # the decoder also builds fused weight copies and a rope table: not KV cache
    extra = int(getattr(decoder, "packed_bytes", 0)) + decoder.rope_table.numel() * decoder.rope_table.element_size()
    measured = torch.cuda.max_memory_allocated() - base - extra
    print(f"embedded KV cache: estimated {estimated / 2**20:.1f} MiB, tensors {kv / 2**20:.1f} MiB, "
          f"allocated {measured / 2**20:.1f} MiB")  # fmt: skip
    assert estimated == kv
    assert abs(estimated - measured) <= TOLERANCE * measured
