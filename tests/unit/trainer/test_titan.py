"""model.impl = "torchtitan" on one process: same numbers as the transformers model, HF names out."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from rlvr.tiny import tiny_config
from rlvr.trainer.forward import token_logprobs, token_values
from rlvr.trainer.model import build_model
from rlvr.trainer.packing import make_micro_batches
from rlvr.trainer.step import update_policy
from rlvr.trainer.weights import iter_full_weights, weight_names

from .conftest import make_batch

pytestmark = pytest.mark.torchtitan
CPU = torch.device("cpu")
NONE = TrainerConfig(strategy="none", lr=1e-3)


def llama_config() -> dict:
    """A tiny Llama 3 (rotary permutation in the adapter, llama3 rope scaling, untied head)."""
    return {
        "model_type": "llama",
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    }


def both(cfg: ModelConfig, trainer: TrainerConfig = NONE, **kwargs):
    hf = build_model(cfg, trainer, device=CPU, **kwargs)
    titan = build_model(cfg.model_copy(update={"impl": "torchtitan"}), trainer, device=CPU, **kwargs)
    return hf, titan


def logprobs(model, batch, *, packing: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    mbs = make_micro_batches(
        batch, packing=packing, max_tokens=48, micro_batch_size=3, attn_implementation="rlvr_packed"
    )
    with torch.no_grad():
        return [token_logprobs(model, mb) for mb in mbs]  # pyright: ignore[reportReturnType]


@pytest.mark.parametrize("source", ["qwen3_folder", "llama3_config"])
def test_logprobs_and_entropy_equal_transformers(tiny_model_dir: Path, source: str) -> None:
    cfg = ModelConfig(path=str(tiny_model_dir)) if source == "qwen3_folder" else ModelConfig(config=llama_config())
    hf, titan = both(cfg)
    batch = make_batch(6)
    for packing in (True, False):  # packed rows: attention stays within each sequence
        for (a, ea), (b, eb) in zip(
            logprobs(hf, batch, packing=packing), logprobs(titan, batch, packing=packing), strict=True
        ):
            assert torch.allclose(a, b, atol=1e-5), (packing, (a - b).abs().max())
            assert torch.allclose(ea, eb, atol=1e-5)


def test_weights_come_out_with_hf_names_and_layouts() -> None:
    hf, titan = both(ModelConfig(config=llama_config()))
    assert sorted(weight_names(titan)) == sorted(weight_names(hf))
    ours = dict(iter_full_weights(titan))
    for name, value in iter_full_weights(hf):  # q/k come back un-permuted
        assert torch.equal(ours[name], value), name


def test_export_loads_in_transformers_with_equal_logits(tmp_path: Path, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rlvr.trainer.checkpoint import export_hf

    _, titan = both(ModelConfig(path=str(tiny_model_dir)))
    with torch.no_grad():
        for p in titan.parameters():  # not the weights it loaded: the export must carry these
            p.add_(0.01 * torch.randn_like(p))
    export_hf(titan, None, tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    ids = torch.randint(4, 90, (2, 17))
    pos = torch.arange(17).expand(2, 17)
    with torch.no_grad():
        expected = titan(input_ids=ids, position_ids=pos).logits
        got = loaded(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-5)


def test_one_grpo_update_gives_the_same_weights(tiny_model_dir: Path) -> None:
    from rlvr.trainer.actor import Actor

    batch = make_batch(8, seed=3)
    trainer = TrainerConfig(strategy="none", lr=1e-3, max_tokens_per_micro_batch=40)
    algorithm = AlgorithmConfig(preset="grpo", kl_coef=0.01)  # a reference model too
    weights = {}
    for impl in ("hf", "torchtitan"):
        model = ModelConfig(path=str(tiny_model_dir), impl=impl)  # pyright: ignore[reportArgumentType]
        actor = Actor.build(model, trainer, algorithm, total_steps=4, device=CPU)
        update_policy(actor, batch)
        weights[impl] = dict(iter_full_weights(actor.model))
    for name, value in weights["hf"].items():
        assert torch.allclose(weights["torchtitan"][name], value, atol=1e-5), name


def _grads(cfg: ModelConfig, trainer: TrainerConfig, mb) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = build_model(cfg, trainer, device=CPU)
    logp, _ = token_logprobs(model, mb, entropy="none")
    logp.sum().backward()
    wrappers = ("._checkpoint_wrapped_module", "._orig_mod")

    def plain(name: str) -> str:
        for w in wrappers:
            name = name.replace(w, "")
        return name

    return logp.detach(), {plain(n): p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("settings", [{"activation_checkpointing": "full"}, {"activation_checkpointing": "selective"},
                                      pytest.param({"compile": True}, marks=pytest.mark.slow)])  # fmt: skip
def test_checkpointing_and_compile_keep_logprobs_and_gradients(tiny_model_dir: Path, settings: dict) -> None:
    """Compile takes minutes on 2 CPU cores (block-causal mask inside the graph): slow-marked."""
    cfg = ModelConfig(path=str(tiny_model_dir), impl="torchtitan")
    (mb,) = make_micro_batches(
        make_batch(4), packing=True, max_tokens=512, micro_batch_size=4, attn_implementation="rlvr_packed"
    )
    logp, grads = _grads(cfg, NONE, mb)
    logp2, grads2 = _grads(cfg, TrainerConfig(strategy="none", **settings), mb)
    assert torch.allclose(logp2, logp, atol=1e-5)
    assert grads.keys() == grads2.keys()
    for name, g in grads.items():
        assert torch.allclose(grads2[name], g, atol=1e-5), name


def test_critic_values_equal_transformers(tiny_model_dir: Path) -> None:
    hf, titan = both(ModelConfig(path=str(tiny_model_dir)), kind="value", seed=7)
    batch = make_batch(5)
    for mb in make_micro_batches(
        batch, packing=True, max_tokens=48, micro_batch_size=2, attn_implementation="rlvr_packed"
    ):
        with torch.no_grad():
            assert torch.allclose(token_values(hf, mb), token_values(titan, mb), atol=1e-5)
    assert sorted(weight_names(titan)) == sorted(weight_names(hf))


def test_unsupported_architectures_say_what_to_use() -> None:
    cfg = ModelConfig(config=tiny_config(vocab_size=64) | {"model_type": "qwen2"}, impl="torchtitan")
    with pytest.raises(ValueError, match="model.impl = 'hf'"):
        build_model(cfg, NONE, device=CPU)
