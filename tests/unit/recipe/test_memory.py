"""The per-GPU memory estimate: its exact terms against a tiny model's real tensors on CPU, and
`validate`'s refusals of a plan that cannot fit (activation and KV terms: tests/gpu)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rlvr.recipe.checks import memory_problem
from rlvr.recipe.load import load_recipe
from rlvr.recipe.memory import (
    GIB,
    engine_load,
    estimate,
    llama_tensors,
    model_shape,
    safetensors_shapes,
    shard_elements,
    value_tensors,
)
from rlvr.recipe.model_folder import longest_sequence
from rlvr.recipe.plan import make_plan

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "quickstart.toml"
POLICY = ROOT / "recipes" / "quickstart" / "policy"

CONFIGS = {
    "llama untied": {"model_type": "llama", "tie_word_embeddings": False},
    "llama biased": {"model_type": "llama", "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3 untied": {"model_type": "qwen3", "tie_word_embeddings": False, "head_dim": 24},
}


def hf_config(extra: dict) -> dict:
    return {
        "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 101, "max_position_embeddings": 256, **extra,
    }  # fmt: skip


def real_model(config: dict) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_shapes_from_a_config_are_the_real_models(name: str) -> None:
    config = hf_config(CONFIGS[name])
    real = {n: tuple(p.shape) for n, p in real_model(config).named_parameters()}
    assert llama_tensors(config) == real


def test_the_weights_headers_give_every_tensor_without_loading_it() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(POLICY)
    shapes = safetensors_shapes(POLICY)
    assert sum(math.prod(s) for s in shapes.values()) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_a_shard_is_the_largest_fsdp2_chunk_of_every_tensor(world: int) -> None:
    model = real_model(hf_config(CONFIGS["llama untied"]))
    expected = sum(torch.chunk(p.detach(), world, dim=0)[0].numel() for p in model.parameters())
    assert shard_elements({n: tuple(p.shape) for n, p in model.named_parameters()}, world) == expected


def test_the_critic_is_the_backbone_plus_a_scalar_head() -> None:
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = hf_config(CONFIGS["llama untied"])
    real = AutoModelForTokenClassification.from_config(AutoConfig.for_model(**config, num_labels=1))
    tensors = value_tensors(llama_tensors(config), config["hidden_size"])
    assert sum(math.prod(s) for s in tensors.values()) == sum(p.numel() for p in real.parameters())


def test_trainer_terms_are_the_fp32_shard_its_gradient_and_adams_two_states() -> None:
    recipe = load_recipe(RECIPE, ["cluster.gpus_per_node=4", "trainer.ranks=3", "cluster.gpu_memory_gb=80",
                                  "algorithm.kl_coef=0.01", "algorithm.kl_in=loss"])  # fmt: skip
    est = estimate(recipe, make_plan(recipe))
    trainer = {t.name.split(" (")[0]: t.bytes for t in est.loads[0].terms}
    shard = shard_elements(safetensors_shapes(POLICY), 3)
    assert trainer["parameters"] == trainer["gradients"] == trainer["reference model"] == 4 * shard
    assert trainer["AdamW states"] == 8 * shard
    server = {t.name.split(" (")[0]: t.bytes for t in est.loads[1].terms}
    params = sum(p.numel() for p in real_model_from(POLICY).parameters())
    assert server["weights"] == params * 4  # the quickstart policy is float32


def real_model_from(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder)


def test_the_embedded_kv_cache_is_what_its_decoder_allocates() -> None:
    from rlvr.server.decoders import StaticKVDecoder

    recipe = load_recipe(RECIPE, ["cluster.gpus_per_node=2", "rollout.max_batch=3", "cluster.gpu_memory_gb=80"])
    shape = model_shape(recipe)
    assert shape is not None
    kv = next(t for t in estimate(recipe, make_plan(recipe)).loads[1].terms if t.name == "KV cache")
    # the length the launcher gives `rlvr serve --max-seq-len` (rlvr.launch.argv.server_command)
    decoder = StaticKVDecoder(real_model_from(POLICY), max_slots=3, max_len=longest_sequence(recipe))
    allocated = sum(t.numel() * t.element_size() for t in (decoder.k_cache, decoder.v_cache))
    assert kv.bytes == allocated


def test_checkpointing_shrinks_the_activation_estimate() -> None:
    plain = load_recipe(RECIPE, ["cluster.gpus_per_node=2"])
    full = load_recipe(RECIPE, ["cluster.gpus_per_node=2", "trainer.activation_checkpointing=full"])

    def activations(r) -> int:
        return next(t.bytes for t in estimate(r, make_plan(r), gpu_bytes=GIB).loads[0].terms if "activ" in t.name)

    assert 0 < activations(full) < activations(plain)


def test_chunked_logits_count_one_chunk_not_every_token() -> None:
    from rlvr.recipe.memory import activation_bytes

    shape = model_shape(load_recipe(RECIPE, []))
    assert shape is not None
    common = {"tokens": 8192, "compute": 2, "checkpointing": True}
    full = activation_bytes(shape, **common)
    chunked = activation_bytes(shape, **common, logits_chunk=1024)
    whole_logits = 8192 * shape.vocab * (2 + 3 * 4)
    one_chunk = 1024 * shape.vocab * (2 + 2 * 4) + shape.vocab * shape.hidden * 4
    assert full - chunked == whole_logits - one_chunk
    assert activation_bytes(shape, **common, logits_chunk=10**6) == activation_bytes(shape, **common, logits_chunk=8192)


def test_validate_refuses_a_trainer_that_does_not_fit_naming_its_largest_term_and_the_fix() -> None:
    recipe = load_recipe(RECIPE, ["cluster.gpus_per_node=2", "cluster.gpu_memory_gb=0.05"])
    key, message = memory_problem(recipe) or ((), "")
    assert key == ("trainer", "max_tokens_per_micro_batch")
    assert "trainer rank needs" in message and "activations" in message
    assert 'activation_checkpointing = "full"' in message and "\n" not in message
    assert memory_problem(load_recipe(RECIPE, ["cluster.gpus_per_node=2", "cluster.gpu_memory_gb=80"])) is None


def test_validate_refuses_vllm_whose_weights_fill_its_memory_fraction() -> None:
    recipe = load_recipe(RECIPE, ["cluster.gpus_per_node=2", "cluster.gpu_memory_gb=0.0005",
                                  "rollout.engine=vllm", "trainer.max_tokens_per_micro_batch=16"])  # fmt: skip
    est = estimate(recipe, make_plan(recipe))
    est.loads = est.loads[1:]  # the server's own verdict (the trainer does not fit either)
    key, message = est.problem() or ((), "")
    assert key == ("rollout", "vllm", "gpu_memory_utilization")
    assert "leaving no KV cache" in message and "rollout.vllm.tp_size" in message


def test_colocated_generation_adds_the_trainers_resident_state_to_the_engine() -> None:
    recipe = load_recipe(RECIPE, ["cluster.gpus_per_node=1", "rollout.colocate=true", "cluster.gpu_memory_gb=80"])
    training, generating = estimate(recipe, make_plan(recipe)).loads
    names = [t.name for t in generating.terms]
    assert any(n.startswith("parameters") for n in names) and "KV cache" in names
    assert not any(n.startswith("gradients") for n in names)  # freed after the optimizer step
    assert not any(n.startswith("activations") for n in names)  # the trainer's step is over
    assert any(n.startswith("activations") for n in (t.name for t in training.terms))


def test_a_cpu_run_has_no_gpu_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("RLVR_PLAN_GPUS", raising=False)
    recipe = load_recipe(RECIPE, [])
    assert estimate(recipe, make_plan(recipe)).skipped


def test_the_slurm_plan_has_the_same_estimate_and_plan_prints_it() -> None:
    from rich.console import Console

    from rlvr.monitor.plan_view import memory_table

    slurm = load_recipe(RECIPE, ["cluster.kind=slurm", "cluster.nodes=2", "cluster.gpus_per_node=4",
                                 "cluster.gpu_memory_gb=0.05", "model.path=" + str(POLICY)])  # fmt: skip
    local = load_recipe(RECIPE, ["cluster.gpus_per_node=8", "trainer.ranks=4", "cluster.gpu_memory_gb=0.05"])
    terms = [[(t.name, t.bytes) for t in load.terms] for load in estimate(slurm, make_plan(slurm)).loads]
    assert terms == [[(t.name, t.bytes) for t in load.terms] for load in estimate(local, make_plan(local)).loads]
    table = memory_table(slurm, make_plan(slurm))
    assert table is not None
    console = Console(record=True, width=200)
    console.print(table)
    text = console.export_text()
    assert "Memory per GPU" in text and "does NOT fit" in text and "AdamW states" in text
    assert memory_problem(slurm) is not None  # validate refuses it on SLURM too


@pytest.mark.parametrize("targets", ["all-linear", '["q_proj","v_proj"]'])
def test_lora_counts_the_real_adapters_and_drops_the_reference(targets: str) -> None:
    """The adapter term is the parameters peft injects (counted on the real model); gradients and AdamW
    states are the adapters', and the KL reference is gone (it is the base, adapters off)."""
    from transformers import AutoModelForCausalLM

    from rlvr.trainer.lora import apply_lora

    base = ["cluster.gpus_per_node=2", "cluster.gpu_memory_gb=80", "algorithm.kl_in=loss", "algorithm.kl_coef=0.01"]
    lora = [*base, "trainer.lora.rank=8", f"trainer.lora.target_modules={targets}"]
    full_recipe, lora_recipe = load_recipe(RECIPE, base), load_recipe(RECIPE, lora)
    full = {t.name: t.bytes for t in estimate(full_recipe, make_plan(full_recipe)).loads[0].terms}
    terms = {t.name: t.bytes for t in estimate(lora_recipe, make_plan(lora_recipe)).loads[0].terms}
    model = apply_lora(AutoModelForCausalLM.from_pretrained(POLICY), lora_recipe.trainer.lora, seed=0)
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad) * 4
    assert terms["LoRA adapters (rank 8, fp32)"] == adapters
    assert terms["gradients (adapters)"] == adapters and terms["AdamW states (2 x fp32, adapters)"] == 2 * adapters
    assert "reference model (fp32 shard)" in full and "reference model (fp32 shard)" not in terms
    assert sum(terms.values()) < sum(full.values())


def test_validate_refuses_a_kv_budget_the_embedded_engine_would_refuse() -> None:
    """`validate`'s check and `rlvr serve`'s own (kv_cache_plan) agree at the boundary: one sequence of
    the recipe's longest length, in the engine's fp32 on CPU."""
    from transformers import AutoConfig

    from rlvr.recipe.checks import kv_budget_problem
    from rlvr.server.kv_cache import KVBudgetError, kv_cache_plan

    config = AutoConfig.from_pretrained(POLICY)
    length = longest_sequence(load_recipe(RECIPE, []))
    one = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4 * length
    for budget, fits in ((one * 0.999, False), (one * 1.001, True)):
        recipe = load_recipe(RECIPE, [f"rollout.kv_cache_gb={budget / 1e9!r}", "cluster.gpus_per_node=0"])
        problem = kv_budget_problem(recipe)
        try:
            kv_cache_plan(config, dtype=torch.float32, max_batch=8, max_len=length, budget_bytes=int(budget))
            engine_fits = True
        except KVBudgetError:
            engine_fits = False
        assert engine_fits == fits and (problem is None) == fits, (budget, problem)
    assert problem is None
    key, message = kv_budget_problem(load_recipe(RECIPE, ["rollout.kv_cache_gb=1e-6"])) or ((), "")
    assert key == ("rollout", "kv_cache_gb") and f"holds no sequence of {length} tokens" in message


def test_the_longest_sequence_counts_a_tool_domains_turns() -> None:
    """A tool episode's budget (model and tool turns together) sizes the longest sequence, for the
    servers and the memory estimate alike; a domain without tools runs no episode."""
    recipe = load_recipe(RECIPE, ["cluster.gpus_per_node=0"])
    prompt, response = recipe.data.max_prompt_tokens, recipe.rollout.max_new_tokens
    episode = response + 100
    plain = recipe.domains["math"].model_copy(update={"max_episode_tokens": episode})
    without_tools = recipe.model_copy(update={"domains": {**recipe.domains, "math": plain}})
    assert longest_sequence(without_tools, capped=False) == prompt + response
    assert without_tools.longest_episode() == (("rollout", "max_new_tokens"), response)
    tool_domain = plain.model_copy(update={"tools": ["python"]})
    with_tools = recipe.model_copy(update={"domains": {**recipe.domains, "math": tool_domain}})
    assert longest_sequence(with_tools, capped=False) == prompt + episode
    assert with_tools.longest_episode() == (("domains", "math", "max_episode_tokens"), episode)
    vllm = with_tools.model_copy(update={"rollout": with_tools.rollout.model_copy(update={"engine": "vllm"})})
    shape = model_shape(vllm)
    assert shape is not None
    load = engine_load(vllm, shape, gpus=[0], gpu_bytes=80 * GIB, role="rollout")
    assert load.note.endswith(f" samples of {prompt + episode} tokens")
