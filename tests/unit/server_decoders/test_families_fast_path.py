"""The embedded engine's decoders beyond plain Llama: Gemma 3 text and sliding windows on the fast
path (`StaticKVDecoder`), and the generic fallback (`RecomputeDecoder`) projecting only each
sequence's last position.

Every model is a tiny random one in fp32 whose sequences (prompt + generated) run well past the
sliding window (8), so a window off by one, a missing window or a missing local rope changes the
logits. The reference is transformers itself: `generate(do_sample=False)` for the token ids and a
plain unpadded forward for the logits at every position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr.server.decoders import RecomputeDecoder, StaticKVDecoder, fast_path_supported

WINDOW = 8
# Prompt lengths around and past the window, each with its own budget, so sequences leave at
# different steps (compaction moves the last slot into the hole) and others join mid-decode.
PROMPT_LENGTHS = (3, 11, 17, 6, 9)
NEW_TOKENS = (30, 22, 26, 28, 12)


def _randomised(model: Any, seed: int = 0) -> Any:
    """Weights large enough that greedy text varies (a fresh init repeats one token), and norm
    weights away from their init so the norm convention (Gemma's 1 + weight) matters."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            std = 0.02 if "embed" in name else 0.2 if param.dim() == 2 else 0.3
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return model.eval()


def gemma3_config(**overrides: Any) -> Any:
    from transformers import Gemma3TextConfig

    settings: dict[str, Any] = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        max_position_embeddings=256,
        query_pre_attn_scalar=24,  # not head_dim: the scaling must come from it
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},  # far from the global theta
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
    )
    settings.update(overrides)
    return Gemma3TextConfig(**settings)


def _model(family: str, **overrides: Any) -> Any:
    from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config

    small: dict[str, Any] = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if family == "gemma3":
        config = gemma3_config(**overrides)
    elif family == "qwen2-sliding":  # layers 1 and 2 windowed (from max_window_layers on)
        config = Qwen2Config(
            **small, num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
        )
    elif family == "mistral-sliding":  # every layer windowed
        config = MistralConfig(**small, num_hidden_layers=2, sliding_window=WINDOW)
    else:
        raise ValueError(family)
    return _randomised(AutoModelForCausalLM.from_config(config, dtype=torch.float32))


@dataclass
class _Seq:
    prompt: list[int]
    budget: int
    generated: list[int] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)  # each step's log-softmax [V]
    cached: int = 0  # positions written to the decoder's cache

    def take(self, logits: torch.Tensor) -> None:
        self.logprobs.append(torch.log_softmax(logits.float(), -1))
        self.generated.append(int(logits.argmax()))

    @property
    def done(self) -> bool:
        return len(self.generated) == self.budget


def _prompts(vocab: int = 300) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def _greedy_loop(
    decoder: Any, prompts: list[list[int]], budgets: tuple[int, ...], slots: int
) -> tuple[list[_Seq], int]:
    """The scheduler's loop in miniature: admit into free slots (one prefill for the batch, at the
    first free slot), decode every live slot, and when a sequence finishes move the last live
    slot into its place. Returns the sequences in prompt order and how many moves ran."""
    queue = [_Seq(p, b) for p, b in zip(prompts, budgets, strict=True)]
    order = list(queue)
    live: list[_Seq] = []
    moves = 0
    while queue or live:
        if queue and len(live) < slots:
            batch, queue = queue[: slots - len(live)], queue[slots - len(live) :]
            for seq, logits in zip(batch, decoder.prefill(len(live), [s.prompt for s in batch]), strict=True):
                seq.take(logits)
                seq.cached = len(seq.prompt)
            live += batch
        else:
            logits = decoder.decode([s.generated[-1] for s in live], [s.cached for s in live])
            for seq, row in zip(live, logits, strict=True):
                seq.take(row)
                seq.cached += 1
        i = 0
        while i < len(live):
            if not live[i].done:
                i += 1
                continue
            last = len(live) - 1
            if i != last:
                decoder.move(last, i, live[last].cached)
                live[i] = live[last]
                moves += 1
            live.pop()
    return order, moves


def _hf_greedy(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    model.generation_config.eos_token_id = None  # greedy to the budget, as the loop above
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens
        )
    return out[0, len(prompt) :].tolist()


def _hf_logprobs(model: Any, seq: _Seq) -> torch.Tensor:
    """Log-softmax of a plain unpadded forward at the positions that predicted each generated token."""
    with torch.no_grad():
        logits = model(torch.tensor([seq.prompt + seq.generated])).logits[0].float()
    return torch.log_softmax(logits, -1)[len(seq.prompt) - 1 : -1]


def _check_against_hf(model: Any, decoder: Any) -> None:
    seqs, moves = _greedy_loop(decoder, _prompts(), NEW_TOKENS, slots=3)
    assert moves >= 2  # compaction ran, not only the last slot leaving
    assert max(len(s.prompt) + len(s.generated) for s in seqs) > 4 * WINDOW
    for seq in seqs:
        assert seq.generated == _hf_greedy(model, seq.prompt, seq.budget)
        torch.testing.assert_close(torch.stack(seq.logprobs), _hf_logprobs(model, seq), atol=1e-4, rtol=0)
    assert len({t for s in seqs for t in s.generated}) > 10  # the text varies: the comparison means something


# -- fast_path_supported --------------------------------------------------------------------------


def test_gemma3_and_windowed_families_take_the_fast_path():
    for family in ("gemma3", "qwen2-sliding", "mistral-sliding"):
        assert fast_path_supported(_model(family)) == (True, ""), family


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"attn_logit_softcapping": 50.0}, "soft-capping"),
        ({"use_bidirectional_attention": True}, "bidirectional"),
        ({"hidden_activation": "relu"}, "activation"),
        ({"sliding_window": None}, "sliding window"),
    ],
)
def test_gemma3_variants_the_fast_path_would_get_wrong_are_refused(overrides, reason):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(gemma3_config(**overrides))
    ok, why = fast_path_supported(model)
    assert not ok and reason in why
    with pytest.raises(ValueError, match="fast path unsupported"):
        StaticKVDecoder(model, max_slots=2, max_len=16)


def test_length_dependent_rope_is_refused():
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=256,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0] * 8,
            "long_factor": [4.0] * 8,
            "original_max_position_embeddings": 64,
        },
    )
    ok, why = fast_path_supported(AutoModelForCausalLM.from_config(config))
    assert not ok and "longrope" in why


# -- the fast path against transformers -----------------------------------------------------------


@pytest.mark.parametrize("family", ["gemma3", "qwen2-sliding", "mistral-sliding"])
def test_fast_path_greedy_ids_and_logprobs_match_hf_past_the_window(family):
    """Several slots of different lengths, joins mid-decode and compaction moves: the greedy ids
    equal HF's `generate` and each step's log-softmax HF's forward within 1e-4."""
    model = _model(family)
    decoder = StaticKVDecoder(model, max_slots=3, max_len=64)
    _check_against_hf(model, decoder)


def test_gemma3_final_logit_softcapping_is_applied():
    model = _model("gemma3", final_logit_softcapping=0.5)  # small: it bends the logits a lot
    decoder = StaticKVDecoder(model, max_slots=3, max_len=64)
    prompts = _prompts()[:3]
    logits = decoder.prefill(0, prompts)
    assert logits.abs().max() < 0.5
    for row, prompt in zip(logits, prompts, strict=True):
        with torch.no_grad():
            expected = model(torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(row, expected, atol=1e-5, rtol=0)


def test_the_window_and_local_rope_are_what_the_reference_depends_on():
    """Guard on the tests above: a model with the window ignored, or with one rope for all layers,
    gives other logits on these sequences, so matching HF pins both down."""
    model = _model("gemma3")
    ids = torch.tensor([_prompts()[2] + list(range(10, 40))])  # 47 tokens, window 8
    with torch.no_grad():
        base = model(ids).logits
        model.config.sliding_window = WINDOW + 1  # off by one
        wider = model(ids).logits
        model.config.sliding_window = WINDOW
    assert (base - wider).abs().max() > 1e-3
    decoder = StaticKVDecoder(model, max_slots=1, max_len=64)
    local, full = decoder.rope_table  # one table per layer type: sliding first
    assert [layer.rope for layer in decoder.layers] == [0, 0, 1, 0, 0, 1]
    assert not torch.allclose(local, full)


def test_gemma3_derived_norm_weights_follow_a_weight_load():
    """Gemma's (1 + weight) norms are derived tensors: `refresh` (which every weight load calls)
    rebuilds them, and the fast path then matches the new weights."""
    model = _model("gemma3")
    decoder = StaticKVDecoder(model, max_slots=2, max_len=64)
    prompts = _prompts()[1:3]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.mul_(-0.5).add_(0.1)
    decoder.refresh(background=False)
    for row, prompt in zip(decoder.prefill(0, prompts), prompts, strict=True):
        with torch.no_grad():
            expected = model(torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(row, expected, atol=1e-5, rtol=0)


# -- the generic fallback -------------------------------------------------------------------------


def _head_inputs(model: Any) -> tuple[list[tuple[int, ...]], Any]:
    shapes: list[tuple[int, ...]] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: shapes.append(tuple(args[0].shape))
    )
    return shapes, hook


@pytest.mark.parametrize("family", ["gemma3", "mistral-sliding"])
def test_recompute_decoder_projects_only_each_sequences_last_position(family):
    """The LM head sees one position per row ([B, 1, D], never [B, T, D]), and the logits equal a
    plain unpadded forward of each sequence within 1e-5, soft-capping (Gemma) included."""
    model = _model(family, **({"final_logit_softcapping": 3.0} if family == "gemma3" else {}))
    decoder = RecomputeDecoder(model, max_slots=3, max_len=64)
    prompts = _prompts()[:3]
    shapes, hook = _head_inputs(model)
    try:
        logits = decoder.prefill(0, prompts)
        step = decoder.decode([7, 8, 9], [len(p) for p in prompts])
    finally:
        hook.remove()
    assert shapes == [(3, 1, 64), (3, 1, 64)]
    for row, prompt in zip(logits, prompts, strict=True):
        with torch.no_grad():
            expected = model(torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(row, expected, atol=1e-5, rtol=0)
    for row, prompt, token in zip(step, prompts, [7, 8, 9], strict=True):
        with torch.no_grad():
            expected = model(torch.tensor([prompt + [token]])).logits[0, -1]
        torch.testing.assert_close(row, expected, atol=1e-5, rtol=0)
    assert not model.get_output_embeddings()._forward_pre_hooks  # the gathering hook is gone


def test_recompute_decoder_greedy_loop_matches_hf():
    model = _model("gemma3")
    _check_against_hf(model, RecomputeDecoder(model, max_slots=3, max_len=64))


# -- the engine, end to end -----------------------------------------------------------------------


def test_embedded_engine_serves_gemma3_on_the_fast_path(tmp_path: Path):
    """A Gemma 3 text folder (char tokenizer) served by `EmbeddedEngine`: the fast path is chosen,
    and with max_batch 2 (joins, leaves, compaction) its greedy ids equal HF's generate."""
    from transformers import AutoModelForCausalLM

    from rlvr.rollout.base import GenerateRequest, SamplingParams
    from rlvr.server.embedded import EmbeddedEngine
    from rlvr.tiny import build_char_tokenizer

    model = _model("gemma3", eos_token_id=1, bos_token_id=2, pad_token_id=0)
    model.save_pretrained(tmp_path)
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    engine = EmbeddedEngine(tmp_path, max_batch=2, device="cpu")
    try:
        assert type(engine.backend).__name__ == "StaticKVDecoder"
        texts = ["the quick brown fox jumps", "a", "solve: 2+2=", "def f(x): return x"]
        requests = [
            GenerateRequest(
                tokenizer.encode(t), SamplingParams(temperature=0.0, max_new_tokens=12 + 6 * i, ignore_eos=True)
            )
            for i, t in enumerate(texts)
        ]
        out = engine.generate_sync(requests)
    finally:
        engine.close()
    for request, completion in zip(requests, out, strict=True):
        expected = _hf_greedy(reference, request.input_ids, request.params.max_new_tokens)
        assert completion.token_ids == expected
