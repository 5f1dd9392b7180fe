"""Tiny models and a char-level tokenizer built from code, for tests, benches and the quickstart.

Nothing can be downloaded at run time, so every test that needs "a model" builds one
here: a Qwen3-architecture causal LM (what torchtitan and SGLang both know) with a
character-level tokenizer saved as a normal HF folder, so the exact loading code users
run on a real Qwen checkout is the code under test.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
CHARS = string.printable[:-2]  # printable ASCII without \x0b \x0c; includes \n \t and space

# A plain chat template: the same text shape for every tokenizer this module builds.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def tiny_config(
    *,
    vocab_size: int,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_positions: int = 1024,
) -> dict[str, Any]:
    """An HF Qwen3 config dict; the ~50M bench model is `hidden_size=512, layers=12, heads=8`."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size or 4 * hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden_size // heads,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "torch_dtype": "float32",
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    }


def build_char_tokenizer():
    """A fast HF tokenizer with one token per printable ASCII character (ids 0-2 are special)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, BOS: 2, "<unk>": 3}
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # pyright: ignore[reportAttributeAccessIssue]  # "." skips "\n"
    core.decoder = decoders.Fuse()  # pyright: ignore[reportAttributeAccessIssue]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model_dir(path: str | Path, *, seed: int = 0, **config_kwargs: Any) -> Path:
    """Write a randomly initialised tiny Qwen3 + char tokenizer as a HF folder; returns it.

    Idempotent: an existing folder with a config.json is returned as is.
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = Path(path)
    if (path / "config.json").exists():
        return path
    tokenizer = build_char_tokenizer()
    config = Qwen3Config(**tiny_config(vocab_size=len(tokenizer), **config_kwargs))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if path.exists():  # an empty or partial folder from an interrupted build
        import shutil

        shutil.rmtree(path)
    tmp.rename(path)  # atomic: a concurrent reader sees no folder or a whole one
    return path
