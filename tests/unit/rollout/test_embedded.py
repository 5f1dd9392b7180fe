"""The embedded engine against a plain full forward of the same weights."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch

from rlvr.bridge import run_blocking
from rlvr.rollout.base import GenerateRequest, RolloutClient, SamplingParams
from rlvr.server.embedded import EmbeddedEngine

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
    assert type(engine.backend).__name__ == "StaticKVDecoder"
    assert isinstance(engine, RolloutClient)  # (after: isinstance narrows `engine` for pyright)


def test_onednn_packed_projections_match_plain_linear(model_dir, monkeypatch):
    """On CPU the fast path runs its projections on oneDNN-packed weight copies: the logits
    equal those of plain `F.linear` to fp32 tolerance, and a weight change reaches them only
    through `refresh()` (which every weight load calls)."""
    from transformers import AutoModelForCausalLM

    from rlvr.server.decoders import StaticKVDecoder, _Linear

    monkeypatch.setattr(_Linear, "MIN_PACKED_NUMEL", 0)  # the tiny model is below both thresholds
    monkeypatch.setattr(_Linear, "MIN_PACKED_MACS", 0)

    def decoder(packed: bool) -> StaticKVDecoder:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        return StaticKVDecoder(model, max_slots=4, max_len=64, packed_weights=packed)

    packed, plain = decoder(True), decoder(False)
    assert packed.layers[0].gate_up.packed is not None and plain.layers[0].gate_up.packed is None
    prompts = [[5, 6, 7, 8], [9, 10]]
    torch.testing.assert_close(packed.prefill(0, prompts), plain.prefill(0, prompts), atol=1e-5, rtol=1e-5)
    step = dict(tokens=[11, 12], positions=[4, 2])
    torch.testing.assert_close(packed.decode(**step), plain.decode(**step), atol=1e-5, rtol=1e-5)

    for d in (packed, plain):
        with torch.no_grad():
            d.layers[0].gate_up.weight.mul_(-1.0)
    stale = packed.decode(tokens=[11, 12], positions=[5, 3])
    expected = plain.decode(tokens=[11, 12], positions=[5, 3])
    assert not torch.allclose(stale, expected, atol=1e-3)
    packed.refresh()  # drops the stale copies at once; rebuilds them on a background thread
    torch.testing.assert_close(packed.decode(tokens=[11, 12], positions=[5, 3]), expected, atol=1e-5, rtol=1e-5)
    packed.wait_packed()
    assert packed.layers[0].gate_up.packed is not None
    torch.testing.assert_close(packed.decode(tokens=[11, 12], positions=[5, 3]), expected, atol=1e-5, rtol=1e-5)


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
        if engine.scheduler.live:
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
        # (900 tokens and a direct call of the scheduler's own pause, on this thread: under load a short
        # generation could finish before the pause lands)
        long_requests = _requests(engine, SamplingParams(temperature=0.0, max_new_tokens=900, ignore_eos=True))
        long_expected = await engine.generate(long_requests)
        task = asyncio.create_task(engine.generate(long_requests))
        await _until_live(engine)
        assert engine.scheduler.pause("retract") > 0
        await asyncio.sleep(0.1)
        assert not task.done()
        await engine.resume()
        assert [c.token_ids for c in await task] == [c.token_ids for c in long_expected]

        # abort: in-flight requests come back at once, marked "abort", with what they had.
        # (900 tokens, like retract above: the engine decodes 500 tiny-model tokens in ~0.2 s,
        # and a loaded CI machine let one finish before the pause landed)
        # A direct call, as for retract: `await engine.pause` goes through a thread pool and the
        # engine's lock, and a loaded machine once let all 900 tokens finish before it landed.
        task = asyncio.create_task(engine.generate(long_requests))
        await _until_live(engine)
        assert engine.scheduler.pause("abort") > 0
        aborted = await asyncio.wait_for(task, 10)
        assert {c.finish_reason for c in aborted} == {"abort"}
        assert all(len(c.token_ids) == len(c.logprobs) < 900 for c in aborted)
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

    perturbed = _perturbed(model_dir, seed=1)
    perturbed.save_pretrained(tmp_path / "v2")

    engine = EmbeddedEngine(model_dir, max_batch=8, device="cpu")
    other = EmbeddedEngine(tmp_path / "v2", max_batch=8, device="cpu")
    try:
        params = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
        before = engine.generate_sync(_requests(engine, params))
        assert {c.policy_version for c in before} == {0}
        run_blocking(engine.update_weights_from_disk(tmp_path / "v2", version="3"))
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join_as_trainer(engine: EmbeddedEngine, group_name: str):
    """A 2-rank gloo update group: this process's rank 0 (the trainer) and the engine's rank 1."""
    from rlvr.sync.group import join_group

    port = _free_port()
    holder: dict[str, object] = {}

    def host():
        holder["group"] = join_group(
            master_address="127.0.0.1", master_port=port, rank=0, world_size=2, group_name=group_name, timeout_s=60
        )

    thread = threading.Thread(target=host)
    thread.start()
    run_blocking(
        engine.init_weights_update_group(
            master_address="127.0.0.1",
            master_port=port,
            rank_offset=1,
            world_size=2,
            group_name=group_name,
            timeout_s=60,
        )
    )
    thread.join(60)
    return holder["group"]


def _perturbed(model_dir, seed: int):
    """The model at `model_dir` with every weight moved by N(0, 0.5): "the trainer's new weights"."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        torch.manual_seed(seed)
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.5)
    return model


def _spy_receives(monkeypatch) -> list[int]:
    """The data pointers every `receive_into` call of the engine writes to, in order."""
    import rlvr.sync.group as rdist

    received: list[int] = []
    real_receive_into = rdist.receive_into

    def spy(group, tensors):
        received.extend(t.data_ptr() for t in tensors)
        real_receive_into(group, tensors)

    monkeypatch.setattr(rdist, "receive_into", spy)
    return received


def _push(engine: EmbeddedEngine, group, group_name: str, named: list[tuple[str, torch.Tensor]], **kw) -> None:
    """Rank 0 broadcasts `named` while the engine receives them as one bucket; re-raises the engine's error."""
    from rlvr.sync.group import dtype_name, send_broadcast

    errors: list[BaseException] = []

    def receive():
        run_blocking(engine.begin_weight_update())  # SGLang 0.5.23 takes buckets only inside a session
        try:
            run_blocking(
                engine.update_weights_from_distributed(
                    [n for n, _ in named],
                    [dtype_name(t.dtype) for _, t in named],
                    [list(t.shape) for _, t in named],
                    group_name=group_name,
                    **kw,
                )
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)
        finally:
            run_blocking(engine.end_weight_update())

    tensors = [t for _, t in named]
    if kw.get("load_format") == "flattened_bucket":  # one broadcast of the bytes back to back
        tensors = [torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])]
    thread = threading.Thread(target=receive)
    thread.start()
    send_broadcast(group, tensors)
    thread.join(60)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def test_distributed_update_writes_into_the_live_weights(model_dir, reference, monkeypatch):
    """Received tensors land in the parameters' own storage (fused Q/K/V, gate/up and tied
    lm_head included), and the fast path generates from the new weights."""
    received = _spy_receives(monkeypatch)
    engine = EmbeddedEngine(model_dir, max_batch=4, device="cpu")
    try:
        assert type(engine.backend).__name__ == "StaticKVDecoder"
        params = dict(engine.model.named_parameters(remove_duplicate=False))
        assert params["lm_head.weight"] is params["model.embed_tokens.weight"]  # tied
        pointers = {name: p.data_ptr() for name, p in params.items()}
        fused = [(layer.qkv.weight.data_ptr(), layer.gate_up.weight.data_ptr()) for layer in engine.backend.layers]

        trainer = _perturbed(model_dir, seed=3)
        from rlvr.trainer.weights import iter_full_weights

        named = list(iter_full_weights(trainer))  # skip_tied: the tied lm_head is not sent
        assert "lm_head.weight" not in dict(named)
        group = _join_as_trainer(engine, "g-live")
        _push(engine, group, "g-live", named, version="5")
        assert received == [pointers[name] for name, _ in named]  # received in place: no buffer, no copy

        after = dict(engine.model.named_parameters(remove_duplicate=False))
        assert {name: p.data_ptr() for name, p in after.items()} == pointers
        assert [
            (layer.qkv.weight.data_ptr(), layer.gate_up.weight.data_ptr()) for layer in engine.backend.layers
        ] == fused
        for name, tensor in named:
            assert torch.equal(after[name], tensor), name
        assert torch.equal(after["lm_head.weight"], dict(named)["model.embed_tokens.weight"])
        layer0 = trainer.model.layers[0]
        attn = layer0.self_attn
        expected_qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        assert torch.equal(engine.backend.layers[0].qkv.weight, expected_qkv)

        greedy = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
        out = engine.generate_sync(_requests(engine, greedy)[:2])
        assert {c.policy_version for c in out} == {5}
        for completion in out:
            expected = _full_forward_logprobs(trainer, completion.prompt_token_ids, completion.token_ids)
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=1e-4)
            old = _full_forward_logprobs(reference, completion.prompt_token_ids, completion.token_ids)
            assert not torch.allclose(old, expected, atol=1e-2)

        # A wire dtype cast goes through a reusable staging buffer; the storage stays put.
        cast = [(n, t.to(torch.bfloat16)) for n, t in named[:3]]
        received.clear()
        _push(engine, group, "g-live", cast)
        assert not set(received) & set(pointers.values())
        for name, tensor in cast:
            assert after[name].data_ptr() == pointers[name]
            assert torch.equal(after[name], tensor.float())

        # A bad name: the bucket is still drained (the collective completes) and nothing changes.
        snapshot = {n: p.clone() for n, p in after.items()}
        bad = [(named[0][0], named[0][1] + 1), ("model.no_such.weight", torch.ones(3))]
        with pytest.raises(ValueError, match="no_such"):
            _push(engine, group, "g-live", bad)
        assert all(torch.equal(after[n], snapshot[n]) for n in snapshot)
        _push(engine, group, "g-live", named[:1])  # the group still works
    finally:
        engine.close()


def test_flattened_bucket_lands_in_the_weight_arena_without_a_copy(model_dir, reference, monkeypatch):
    """SGLang's flattened_bucket format: one uint8 broadcast per bucket. The engine keeps its
    weights in one buffer in send order, so an in-order bucket is received straight into it;
    an out-of-order bucket goes through staging. Both leave exactly the trainer's weights."""
    from rlvr.trainer.weights import iter_full_weights

    received = _spy_receives(monkeypatch)
    engine = EmbeddedEngine(model_dir, max_batch=4, device="cpu")
    try:
        arena = engine.weights.arena
        assert arena is not None
        named = list(iter_full_weights(_perturbed(model_dir, seed=5)))
        group = _join_as_trainer(engine, "g-flat")

        def push(bucket, version):
            _push(engine, group, "g-flat", bucket, version=version, load_format="flattened_bucket")

        half = len(named) // 2
        push(named[:half], None)
        push(named[half:], "7")
        first_offset = dict(engine.model.named_parameters())[named[half][0]].data_ptr() - arena.data_ptr()
        assert received == [arena.data_ptr(), arena.data_ptr() + first_offset]  # in place, no staging
        params = dict(engine.model.named_parameters(remove_duplicate=False))
        for name, tensor in named:
            assert torch.equal(params[name], tensor), name

        received.clear()
        shuffled = [(n, t * 0 + 1) for n, t in reversed(named[:4])]  # out of send order: staged, copied
        push(shuffled, "8")
        assert received and received[0] not in (p.data_ptr() for p in params.values())
        for name, tensor in shuffled:
            assert torch.equal(params[name], tensor), name
        assert engine.weight_version == "8"
    finally:
        engine.close()


def test_worker_threads_default_to_one_for_narrow_cpu_models(engine, model_dir):
    """Small ops on the engine's own thread run faster unsplit (see `default_threads`);
    wide models keep every core, GPUs are untouched, and `threads=` overrides."""
    from types import SimpleNamespace

    from rlvr.server.batching import default_threads

    def model(hidden):
        return SimpleNamespace(config=SimpleNamespace(hidden_size=hidden))

    assert default_threads(model(64), "cpu", 8) == 1
    assert default_threads(model(512), "cpu", 8) == 8
    assert default_threads(model(64), "cuda", 8) == 8
    assert engine.threads == 1  # the tiny test model
    pinned = EmbeddedEngine(model_dir, max_batch=2, device="cpu", threads=2)
    try:
        assert pinned.threads == 2
    finally:
        pinned.close()


def test_run_blocking_runs_a_coroutine_with_or_without_a_running_loop():
    """The bridge for synchronous callers: the result or the exception comes back, whether the
    calling thread runs an event loop (an async test, the rollout manager's thread) or not."""

    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    async def fail() -> None:
        raise KeyError("no such group")

    assert run_blocking(double(21)) == 42
    with pytest.raises(KeyError, match="no such group"):
        run_blocking(fail())

    async def inside_a_loop() -> int:
        return run_blocking(double(4))

    assert asyncio.run(inside_a_loop()) == 8
