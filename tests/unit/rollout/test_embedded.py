"""The embedded engine against a plain full forward of the same weights."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch

from rlvr.rollout.embedded import EmbeddedEngine
from rlvr.rollout.engine import GenerateRequest, RolloutEngine, SamplingParams

PROMPTS = ["hello", "the quick brown fox", "a", "xyz 123 abc", "solve: 2+2=", "def f(x):\n    return"]


@pytest.fixture(scope="module")
def engine(model_dir: Path):
    eng = EmbeddedEngine(model_dir, max_batch=32, device="cpu")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _requests(engine: EmbeddedEngine, params: SamplingParams, n: int = 1) -> list[GenerateRequest]:
    return [GenerateRequest(engine.tokenizer.encode(p), params, n=n) for p in PROMPTS]


def _full_forward_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, -1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def test_is_a_rollout_engine(engine):
    assert isinstance(engine, RolloutEngine)
    assert type(engine.backend).__name__ == "StaticKVDecoder"


def test_greedy_tokens_and_logprobs_match_a_full_forward(engine, reference):
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    out = engine.generate_sync(_requests(engine, params))
    assert len(out) == len(PROMPTS)
    for completion in out:
        assert len(completion.token_ids) == 24 and completion.finish_reason == "length"
        with torch.no_grad():
            ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
            logits = reference(ids).logits[0, len(completion.prompt_token_ids) - 1 : -1]
        assert logits.argmax(-1).tolist() == completion.token_ids
        expected = _full_forward_logprobs(reference, completion.prompt_token_ids, completion.token_ids)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


def test_sampled_logprobs_are_those_of_the_temperature_scaled_policy(engine, reference):
    params = SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=16, ignore_eos=True, seed=5)
    for completion in engine.generate_sync(_requests(engine, params, n=2)):
        expected = _full_forward_logprobs(reference, completion.prompt_token_ids, completion.token_ids, 0.7)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


def test_seed_makes_sampling_reproducible_and_n_samples_differ(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=20, ignore_eos=True, seed=123)
    first = engine.generate_sync(_requests(engine, params, n=3))
    second = engine.generate_sync(_requests(engine, params, n=3))
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    group = [c.token_ids for c in first[:3]]
    assert len({tuple(t) for t in group}) == 3
    other = engine.generate_sync(_requests(engine, SamplingParams(temperature=1.0, max_new_tokens=20, seed=9), n=3))
    assert [c.token_ids for c in other] != [c.token_ids for c in first]


def test_continuous_batching_matches_one_big_batch(model_dir, engine):
    # Different lengths and limits make sequences leave and join at different steps.
    requests = [
        GenerateRequest(engine.tokenizer.encode(p), SamplingParams(temperature=0.0, max_new_tokens=5 + 4 * i), n=2)
        for i, p in enumerate(PROMPTS)
    ]
    big = engine.generate_sync(requests)
    small_engine = EmbeddedEngine(model_dir, max_batch=2, device="cpu")
    try:
        small = small_engine.generate_sync(requests)
    finally:
        small_engine.close()
    assert [c.token_ids for c in small] == [c.token_ids for c in big]
    for a, b in zip(small, big, strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_seeded_sampling_does_not_depend_on_batch_neighbours(engine):
    params = SamplingParams(temperature=0.9, top_k=20, max_new_tokens=12, ignore_eos=True, seed=42)
    target = GenerateRequest(engine.tokenizer.encode("hello"), params)
    alone = engine.generate_sync([target])[0]
    crowd = engine.generate_sync(_requests(engine, SamplingParams(temperature=1.0, max_new_tokens=30)) + [target])
    assert crowd[-1].token_ids == alone.token_ids


def test_stop_string_is_cut_from_text_but_its_tokens_stay(engine):
    prompt = engine.tokenizer.encode("the quick brown fox")
    free = engine.generate_sync([GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=20))])[0]
    stop = free.text[5:7]
    assert len(stop) == 2
    params = SamplingParams(temperature=0.0, max_new_tokens=20, stop=[stop])
    out = engine.generate_sync([GenerateRequest(prompt, params)])[0]
    cut = free.text.find(stop)
    assert out.finish_reason == "stop"
    assert out.text == free.text[:cut]
    assert engine.tokenizer.decode(out.token_ids).endswith(stop)
    assert out.token_ids == free.token_ids[: len(out.token_ids)]


def test_stop_token_ids_end_the_sequence_and_are_kept(engine):
    prompt = engine.tokenizer.encode("xyz 123 abc")
    free = engine.generate_sync([GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=20))])[0]
    stop_id = free.token_ids[4]
    first = free.token_ids.index(stop_id)
    params = SamplingParams(temperature=0.0, max_new_tokens=20, stop_token_ids=[stop_id])
    out = engine.generate_sync([GenerateRequest(prompt, params)])[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == free.token_ids[: first + 1]
    assert len(out.logprobs) == len(out.token_ids)


def test_eos_stops_unless_ignored(engine):
    eos = engine.tokenizer.eos_token_id
    prompt = engine.tokenizer.encode("hello")
    free = engine.generate_sync([GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=10))])[0]
    # Make EOS the greedy choice at step 3 by asking for it as the stop id of a request that ignores eos.
    params = SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True)
    assert engine.generate_sync([GenerateRequest(prompt, params)])[0].finish_reason == "length"
    assert eos in engine.eos_ids
    assert free.finish_reason in ("length", "stop")


async def _until_live(engine: EmbeddedEngine) -> None:
    """Wait until the worker has admitted something (it runs in its own thread)."""
    for _ in range(500):
        if engine._live:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nothing was admitted")


async def test_async_generate_and_pause_modes(model_dir):
    engine = EmbeddedEngine(model_dir, max_batch=4, device="cpu")
    try:
        params = SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True)
        requests = _requests(engine, params)
        expected = await engine.generate(requests)

        # in_place: a request issued while paused waits, then finishes identically after resume.
        await engine.pause("in_place")
        task = asyncio.create_task(engine.generate(requests))
        await asyncio.sleep(0.3)
        assert not task.done()
        await engine.resume()
        assert [c.token_ids for c in await task] == [c.token_ids for c in expected]

        # retract mid-generation: sequences restart from prompt + tokens so far; greedy output is unchanged.
        long_requests = _requests(engine, SamplingParams(temperature=0.0, max_new_tokens=400, ignore_eos=True))
        long_expected = await engine.generate(long_requests)
        task = asyncio.create_task(engine.generate(long_requests))
        await _until_live(engine)
        assert await asyncio.to_thread(engine.pause_sync, "retract") > 0
        await asyncio.sleep(0.1)
        assert not task.done()
        await engine.resume()
        assert [c.token_ids for c in await task] == [c.token_ids for c in long_expected]

        # abort: in-flight requests come back at once, marked "abort", with what they had.
        long = SamplingParams(temperature=0.0, max_new_tokens=500, ignore_eos=True)
        task = asyncio.create_task(engine.generate(_requests(engine, long)))
        await _until_live(engine)
        await engine.pause("abort")
        aborted = await asyncio.wait_for(task, 10)
        assert {c.finish_reason for c in aborted} == {"abort"}
        assert all(len(c.token_ids) == len(c.logprobs) < 500 for c in aborted)
        await engine.resume()
        assert await engine.health()
    finally:
        engine.close()


async def test_cancelled_generate_frees_its_slots(engine):
    long = SamplingParams(temperature=0.0, max_new_tokens=500, ignore_eos=True)
    task = asyncio.create_task(engine.generate(_requests(engine, long)))
    await _until_live(engine)
    task.cancel()
    for _ in range(500):
        if engine.num_running() == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.num_running() == 0
    quick = SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True)
    assert all(len(c.token_ids) == 3 for c in await engine.generate(_requests(engine, quick)))


def test_weight_update_from_disk_changes_outputs_and_version(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    perturbed = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        torch.manual_seed(1)
        for weight in perturbed.parameters():
            weight.add_(torch.randn_like(weight) * 0.5)
    perturbed.save_pretrained(tmp_path / "v2")

    engine = EmbeddedEngine(model_dir, max_batch=8, device="cpu")
    other = EmbeddedEngine(tmp_path / "v2", max_batch=8, device="cpu")
    try:
        params = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
        before = engine.generate_sync(_requests(engine, params))
        assert {c.policy_version for c in before} == {0}
        engine.update_weights_from_disk_sync(tmp_path / "v2", version="3")
        after = engine.generate_sync(_requests(engine, params))
        assert [c.token_ids for c in after] != [c.token_ids for c in before]
        assert [c.token_ids for c in after] == [c.token_ids for c in other.generate_sync(_requests(engine, params))]
        assert {c.policy_version for c in after} == {3}
    finally:
        engine.close()
        other.close()


def test_generic_fallback_matches_fast_path(model_dir, engine):
    slow = EmbeddedEngine(model_dir, max_batch=4, device="cpu", fast=False)
    try:
        assert type(slow.backend).__name__ == "RecomputeDecoder"
        params = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
        fast_out = engine.generate_sync(_requests(engine, params, n=2))
        slow_out = slow.generate_sync(_requests(slow, params, n=2))
        assert [c.token_ids for c in slow_out] == [c.token_ids for c in fast_out]
    finally:
        slow.close()


def test_prompt_longer_than_the_cache_is_refused(model_dir):
    engine = EmbeddedEngine(model_dir, max_batch=2, device="cpu", max_seq_len=16)
    try:
        with pytest.raises(ValueError, match="max_len"):
            engine.generate_sync([GenerateRequest(list(range(5, 25)), SamplingParams())])
        out = engine.generate_sync([GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=100, ignore_eos=True))])
        assert out[0].finish_reason == "length" and len(out[0].token_ids) == 16 - 3
    finally:
        engine.close()


def test_worker_thread_keeps_serving_concurrent_callers(engine):
    params = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    results: list[list[int]] = []

    def call():
        results.append(engine.generate_sync(_requests(engine, params))[0].token_ids)

    threads = [threading.Thread(target=call) for _ in range(3)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert time.monotonic() - start < 60
    assert len(results) == 3 and len({tuple(r) for r in results}) == 1
