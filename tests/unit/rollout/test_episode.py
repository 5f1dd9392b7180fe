"""Episodes across a weight update, on the real embedded engine: pause(abort) -> load -> continue.

Greedy decoding makes the claims exact: with the same weights an interrupted episode equals an
uninterrupted one token for token; with new weights its tokens switch to the new policy exactly
at the interruption, and `token_versions` says so.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlvr.rollout.embedded import EmbeddedEngine
from rlvr.rollout.engine import GenerateRequest, SamplingParams
from rlvr.rollout.episode import run_episode

LONG = SamplingParams(temperature=0.0, max_new_tokens=900, ignore_eos=True)


def _perturbed_state(model_dir) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.5)
    return {
        k: v for k, v in model.state_dict().items() if k != "lm_head.weight" or not model.config.tie_word_embeddings
    }


async def _interrupted(engine: EmbeddedEngine, prompt: list[int], *, partial: bool, new_weights=None):
    """Run an episode; once it has some tokens, abort it, load weights as version 1, continue
    (the module's engine is put back at version 0 first)."""
    engine.load_state_dict([], version="0")
    gate = asyncio.Event()
    gate.set()
    task = asyncio.create_task(
        run_episode(engine, prompt_ids=prompt, params=LONG, partial=partial, weights_ready=gate.wait)
    )
    for _ in range(1000):
        if engine._live and len(engine._live[0].out) >= 20:
            break
        await asyncio.sleep(0.005)
    else:
        raise AssertionError("the episode never started decoding")
    gate.clear()  # what the rollout manager does before a push
    assert engine.pause_sync("abort") == 1
    if new_weights is None:
        engine.load_state_dict([], version="1")
    else:
        engine.load_state_dict(new_weights, version="1")
    engine.resume_sync()
    gate.set()
    return await asyncio.wait_for(task, 120)


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = EmbeddedEngine(model_dir, max_batch=4, device="cpu")
    yield eng
    eng.close()


async def test_same_weights_interrupted_equals_uninterrupted(engine):
    prompt = engine.tokenizer.encode("the quick brown fox")
    (straight,) = await engine.generate([GenerateRequest(prompt, LONG)])
    episode = await _interrupted(engine, prompt, partial=True)
    assert episode.token_ids == straight.token_ids
    assert episode.finish_reason == "length" and len(episode.logprobs) == 900
    cut = episode.token_versions.index(1)
    assert 20 <= cut < 900 and set(episode.token_versions[:cut]) == {0} and set(episode.token_versions[cut:]) == {1}
    assert episode.oldest_version == 0 and episode.policy_version == 1
    torch.testing.assert_close(torch.tensor(episode.logprobs), torch.tensor(straight.logprobs), atol=1e-4, rtol=0)


async def test_new_weights_switch_exactly_at_the_interruption(engine, model_dir):
    prompt = engine.tokenizer.encode("solve: 2+2=")
    (old,) = await engine.generate([GenerateRequest(prompt, LONG)])
    new = _perturbed_state(model_dir)
    try:
        episode = await _interrupted(engine, prompt, partial=True, new_weights=new)
        cut = episode.token_versions.index(1)
        assert episode.token_ids[:cut] == old.token_ids[:cut]  # the old policy's tokens, kept
        # after the cut: what the new weights generate greedily from prompt + the kept prefix
        rest = SamplingParams(temperature=0.0, max_new_tokens=900 - cut, ignore_eos=True)
        (cont,) = await engine.generate([GenerateRequest(prompt + episode.token_ids[:cut], rest)])
        assert episode.token_ids[cut:] == cont.token_ids
        assert episode.token_ids != old.token_ids
    finally:
        engine.update_weights_from_disk_sync(model_dir, version="0")


async def test_without_partial_an_aborted_episode_restarts_from_its_prompt(engine, model_dir):
    prompt = engine.tokenizer.encode("hello")
    new = _perturbed_state(model_dir)
    try:
        episode = await _interrupted(engine, prompt, partial=False, new_weights=new)
        assert set(episode.token_versions) == {1} and len(episode.token_ids) == 900
        (fresh,) = await engine.generate([GenerateRequest(prompt, LONG)])
        assert episode.token_ids == fresh.token_ids  # entirely the new policy's answer
    finally:
        engine.update_weights_from_disk_sync(model_dir, version="0")
