"""The embedded engine against transformers, per family: greedy ids equal `generate(do_sample=False)`
of the same fp32 weights, and sampled tokens' log-probs equal a transformers forward within 1e-4.

Prompts of different lengths run batched (so slot packing and compaction show), and prompt +
completion reaches 4-5x the window. The decoder the engine picks (static-KV fast path or the generic
transformers forward) is the one `rlvr.recipe.families` claims for the family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr.recipe.families import FAMILIES
from rlvr.rollout.base import GenerateRequest, SamplingParams
from rlvr.server.embedded import EmbeddedEngine

from .configs import WINDOW

NEW_TOKENS = 3 * WINDOW
LOGPROB_TOL = 1e-4
PROMPTS = [[2, *range(10, 10 + 2 * WINDOW)], [2, 40, 41, 42], [2, *range(50, 50 + WINDOW + 1)]]
pytestmark = pytest.mark.parametrize("family", sorted(FAMILIES))


@pytest.fixture
def engine(family_dir: Path):
    eng = EmbeddedEngine(family_dir, max_batch=4, max_seq_len=96, device="cpu")
    yield eng
    eng.close()


def hf_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def test_greedy_ids_equal_transformers_generate(engine: EmbeddedEngine, family_dir: Path, family: str) -> None:
    fast = type(engine.backend).__name__ != "RecomputeDecoder"
    assert ("fast" if fast else "generic") == FAMILIES[family].engine, "the decoder the matrix claims"
    model = hf_model(family_dir)
    params = SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS)
    served = engine.generate_sync([GenerateRequest(p, params) for p in PROMPTS])
    for prompt, completion in zip(PROMPTS, served, strict=True):
        with torch.no_grad():  # it stops at the EOS (1) and keeps it, as the engine does
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        assert completion.token_ids == out[0, len(prompt) :].tolist()


def test_sampled_logprobs_equal_a_transformers_forward(engine: EmbeddedEngine, family_dir: Path) -> None:
    """At T = 0.7 (the log-probs are those of the tempered distribution, as the trainer's forward)."""
    temperature = 0.7
    model = hf_model(family_dir)
    params = SamplingParams(temperature=temperature, max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=3)
    served = engine.generate_sync([GenerateRequest(p, params, n=2) for p in PROMPTS])
    worst = 0.0
    for completion in served:
        ids = completion.prompt_token_ids + completion.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, len(completion.prompt_token_ids) - 1 : -1].float()
        expected = torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(completion.token_ids)[:, None])
        worst = max(worst, float((expected[:, 0] - torch.tensor(completion.logprobs)).abs().max()))
    assert worst < LOGPROB_TOL, worst
