"""Verified pushes (`sync.verify`) against the real embedded engine: a tensor corrupted on its way
in, a tied head left stale, a clean push, and continue mode dropping the engine that differs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from rlvr.rollout.base import EMBEDDED_ENGINE
from rlvr.server.embedded import EmbeddedEngine
from rlvr.sync import SyncError
from rlvr.sync.broadcast import BroadcastSync
from rlvr.sync.disk import DiskSync
from rlvr.sync.fingerprint import Fingerprinter, fingerprint, first_difference
from rlvr.sync.inprocess import InProcessSync
from rlvr.trainer.weights import iter_full_weights

from .conftest import ParentClient

A, B = "http://engine-a:0", "http://engine-b:0"
CORRUPT = "model.layers.0.mlp.up_proj.weight"


class Engine:
    """The embedded engine as the sync's one-URL client (it outlives the sync)."""

    def __init__(self, engine: EmbeddedEngine):
        self.engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def flush_cache(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _trainer(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        torch.manual_seed(3)
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight))
    return model


def _corrupt_on_arrival(monkeypatch: pytest.MonkeyPatch, engine: EmbeddedEngine, method: str) -> None:
    """`method` of the engine's receiver lands the weights, then one value of CORRUPT is off."""
    receiver = engine.weights
    real = getattr(receiver, method)

    def corrupted(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        with torch.no_grad():
            receiver.weight_table()[CORRUPT].view(-1)[0] += 1.0

    monkeypatch.setattr(receiver, method, corrupted)


def test_fingerprint_is_exact_wherever_the_bytes_live_and_names_the_first_difference() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(1000), torch.randn(10, dtype=torch.float32)
    sent = fingerprint([("a", a), ("b", b)])
    assert first_difference(sent, {"a": list(sent["a"]), "b": list(sent["b"])}) is None
    assert first_difference(sent, {"a": [float(w) for w in sent["a"]], "b": list(sent["b"])}) is None  # JSON floats
    shared = torch.empty(1 + 1000 + 10)  # the same values packed at an odd offset of one buffer
    shared[1:1001], shared[1001:] = a, b
    assert fingerprint([("a", shared[1:1001]), ("b", shared[1001:])]) == sent
    assert first_difference(sent, fingerprint([("a", a.flip(0)), ("b", b)])) == "a"  # same values, moved
    b[3] = torch.nextafter(b[3], torch.tensor(1.0))  # one value, one unit in the last place
    assert first_difference(sent, fingerprint([("a", a), ("b", b)])) == "b"
    assert first_difference(sent, {"a": list(sent["a"])}) == "b"  # a tensor the engine lacks
    assert first_difference(sent, {"a": list(sent["a"])[:2], "b": list(sent["b"])}) == "a"  # an old 2-word answer
    assert all(isinstance(w, int) and 0 <= w < 2**32 for w in sent["a"]) and len(sent["a"]) == 4  # JSON-exact


def _one(tensor: torch.Tensor) -> tuple[int, ...]:
    return fingerprint([("t", tensor)])["t"]


def test_same_bytes_same_checksum_and_a_tensor_the_sender_reuses_is_read_when_added() -> None:
    torch.manual_seed(1)
    weight = torch.randn(64, 48)
    assert _one(weight) == _one(weight.clone()) == _one(weight.t().contiguous().t())  # a view, copied in order
    assert _one(weight.bfloat16()) == _one(weight.bfloat16().clone())
    recorder = Fingerprinter()
    buffer = weight.clone()
    recorder.add("first", buffer)
    buffer.zero_()  # the sender's buffer, reused for the next bucket
    recorder.add("second", buffer)
    recorder.alias("tied", of="first")
    result = recorder.result()
    assert result["first"] == result["tied"] == _one(weight) and result["second"] == _one(torch.zeros(64, 48))


def test_values_that_changed_places_change_the_checksum() -> None:
    """What a wrong shard order or head layout gives: the same values, moved. A sum of words
    (the checksum before XXH3) is blind to every one of these."""
    torch.manual_seed(2)
    weight = torch.randn(8, 16)
    rows = weight.clone()
    rows[[2, 5]] = rows[[5, 2]]  # two rows swapped
    assert _one(rows) != _one(weight)
    heads, head_dim = 4, 4  # q_proj's rows are heads x head_dim: two heads swapped
    q = torch.randn(heads * head_dim, 16)
    swapped = q.view(heads, head_dim, 16)[[1, 0, 2, 3]].reshape(heads * head_dim, 16)
    assert _one(swapped) != _one(q)
    first, second = torch.randn(4, 16), torch.randn(4, 16)  # two tensor-parallel shards, concatenated
    assert _one(torch.cat([second, first])) != _one(torch.cat([first, second]))
    assert _one(torch.cat([first, second], dim=1)) != _one(torch.cat([second, first], dim=1))
    words = torch.arange(4, dtype=torch.int64)  # even two 8-byte words that trade places
    assert _one(words[[1, 0, 2, 3]]) != _one(words)


def test_every_byte_counts_tail_and_bf16_included() -> None:
    torch.manual_seed(3)
    odd = torch.randn(11).bfloat16()  # 22 bytes: two 8-byte words and a 6-byte tail
    assert odd.numel() * odd.element_size() % 8 != 0
    tail = odd.clone()
    tail.view(torch.uint8)[-1] ^= 1  # one bit of the last byte
    assert _one(tail) != _one(odd)
    head = odd.clone()
    head.view(torch.uint8)[0] ^= 1
    assert _one(head) != _one(odd)
    three = torch.tensor([1, 2, 3], dtype=torch.uint8)  # shorter than one word
    assert _one(three) != _one(torch.tensor([1, 2, 4], dtype=torch.uint8))
    half = torch.randn(32, 8).bfloat16()
    nudged = half.clone()
    nudged.view(torch.int16)[7, 3] += 1  # one bf16 value, one unit in the last place
    assert not torch.equal(nudged, half) and _one(nudged) != _one(half)
    assert _one(half) != _one(half.float())  # the dtype on the wire is part of what is compared
    assert _one(torch.empty(0)) == _one(torch.empty(0, 3))  # nothing to read: still one answer


@pytest.mark.timeout(120)
def test_broadcast_push_with_a_tensor_corrupted_in_transit_fails_naming_engine_and_tensor(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = EmbeddedEngine(tiny_model_dir, max_batch=2, device="cpu", max_seq_len=32)
    _corrupt_on_arrival(monkeypatch, engine, "receive_bucket")
    sync = BroadcastSync(
        _trainer(tiny_model_dir),
        client=ParentClient([A]),
        master_address="127.0.0.1",
        backend="gloo",
        bucket_mb=0.05,
        timeout_s=60,
        engine_factory=lambda url: Engine(engine),
    )
    try:
        with pytest.raises(SyncError) as caught:
            sync.push(version=1)
    finally:
        sync.close()
        engine.close()
    assert str(caught.value) == (
        f"weight sync to version 1 failed: {A} (verify): served weights differ from those sent, first at {CORRUPT}"
    )
    assert "\n" not in str(caught.value)
    assert engine.paused  # never resumed on weights it does not have


@pytest.mark.timeout(120)
def test_a_tied_head_left_stale_is_caught(tiny_model_dir: Path) -> None:
    engine = EmbeddedEngine(tiny_model_dir, max_batch=2, device="cpu", max_seq_len=32)
    head = engine.model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)  # no longer follows
    trainer = _trainer(tiny_model_dir)
    assert cast(Any, trainer).config.tie_word_embeddings  # an HF model, typed as a Module
    sync = InProcessSync(trainer, engine=engine)
    try:
        with pytest.raises(SyncError, match=r"^weight sync to version 2 failed: in-process engine \(verify\): "
                           r"served weights differ from those sent, first at lm_head\.weight$"):  # fmt: skip
            sync.push(version=2)
    finally:
        engine.close()


@pytest.mark.timeout(120)
def test_a_clean_push_passes_and_reports_verify_seconds(tiny_model_dir: Path) -> None:
    engine = EmbeddedEngine(tiny_model_dir, max_batch=2, device="cpu", max_seq_len=32)
    trainer = _trainer(tiny_model_dir)
    sync = BroadcastSync(
        trainer,
        client=ParentClient([A]),
        master_address="127.0.0.1",
        backend="gloo",
        bucket_mb=0.05,
        timeout_s=60,
        engine_factory=lambda url: Engine(engine),
    )
    half = EmbeddedEngine(tiny_model_dir, max_batch=2, device="cpu", max_seq_len=32, dtype="bfloat16")
    per_tensor = BroadcastSync(
        trainer,
        client=ParentClient([B]),
        master_address="127.0.0.1",
        backend="gloo",
        bucket_mb=0.05,
        timeout_s=60,
        dtype=torch.bfloat16,
        wire_format="per_tensor",  # cast into reused staging buffers: each tensor still summed as itself
        engine_factory=lambda url: Engine(half),
    )
    try:
        metrics = sync.push(version=4)
        assert per_tensor.push(version=3)["sync/verify_s"] > 0
        inprocess = InProcessSync(trainer, engine=engine).push(version=5)
        off = InProcessSync(trainer, engine=engine, verify="off").push(version=6)
    finally:
        sync.close()
        per_tensor.close()
        engine.close()
        half.close()
    assert metrics["sync/engines"] == 1 and metrics["sync/verify_s"] > 0 and metrics["sync/verified_engines"] == 1
    assert inprocess["sync/verify_s"] > 0 and off["sync/verify_s"] == 0
    assert inprocess["sync/verified_engines"] == 1 and off["sync/verified_engines"] == 0
    live = dict(engine.model.named_parameters(remove_duplicate=False))
    for name, tensor in iter_full_weights(trainer):
        assert torch.equal(live[name], tensor), name


@pytest.mark.timeout(120)
def test_continue_mode_drops_the_engine_that_differs_not_the_run(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    good = EmbeddedEngine(tiny_model_dir, max_batch=2, device="cpu", max_seq_len=32)
    bad = EmbeddedEngine(tiny_model_dir, max_batch=2, device="cpu", max_seq_len=32)
    _corrupt_on_arrival(monkeypatch, bad, "load_from_disk")
    client = ParentClient([A, B])
    engines = {A: Engine(good), B: Engine(bad)}
    sync = DiskSync(
        _trainer(tiny_model_dir),
        shared_dir=tmp_path,
        client=client,
        timeout_s=60,
        on_engine_failure="continue",
        engine_factory=engines.__getitem__,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="rlvr.sync.engine_calls"):
            metrics = sync.push(version=7)
    finally:
        sync.close()
        good.close()
        bad.close()
    assert metrics["sync/engines"] == 1 and metrics["sync/dropped_engines"] == 1 and metrics["sync/verify_s"] > 0
    assert metrics["sync/verified_engines"] == 1  # the good one; the one that differed is not counted
    assert client.live_servers == [A] and not good.paused and bad.paused
    assert [r.getMessage() for r in caplog.records] == [
        f"weight sync: dropping engine {B} (verify): served weights differ from those sent, first at {CORRUPT}"
    ]


@pytest.mark.timeout(120)
def test_rlvr_serve_answers_its_fingerprint_over_http(tiny_model_dir: Path) -> None:
    from aiohttp.test_utils import TestServer

    from rlvr.bridge import run_blocking
    from rlvr.rollout.sglang import SGLangClient
    from rlvr.server.routes import create_app

    engine = EmbeddedEngine(tiny_model_dir, max_batch=2, device="cpu", max_seq_len=32)

    async def ask() -> tuple[dict[str, Any], dict[str, Any]]:
        async with TestServer(create_app(engine)) as server:
            client = SGLangClient([str(server.make_url("")).rstrip("/")], max_retries=0)
            try:
                return await client.weights_fingerprint(), await client.server_info()
            finally:
                await client.close()

    try:
        served, info = run_blocking(ask())
        direct = run_blocking(engine.weights_fingerprint())
    finally:
        engine.close()
    assert served == direct and "lm_head.weight" in served
    assert info["engine"] == EMBEDDED_ENGINE  # what sync.verify = "auto" reads to verify rlvr serve
    assert first_difference(fingerprint(iter_full_weights(_trainer(tiny_model_dir))), served) is not None


@pytest.fixture
def lora_model(tiny_model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from rlvr.recipe.schema import LoraConfig
    from rlvr.trainer.lora import apply_lora

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return apply_lora(model, LoraConfig(rank=2, alpha=4.0, target_modules=["q_proj", "v_proj"]), seed=0)


@pytest.mark.timeout(120)
def test_an_adapter_push_is_verified_and_an_adapter_the_engine_did_not_load_is_caught(
    tiny_model_dir: Path, lora_model: torch.nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    from rlvr.sync.adapter import AdapterSync

    engine = EmbeddedEngine(tiny_model_dir, max_batch=2, device="cpu", max_seq_len=32)
    sync = AdapterSync(
        lora_model, shared_dir=tmp_path, client=ParentClient([A]), engine_factory=lambda u: Engine(engine)
    )
    lora_b = cast(Any, lora_model).model.layers[0].self_attn.q_proj.lora_B["default"].weight
    try:
        with torch.no_grad():
            lora_b.add_(0.5)
        clean = sync.push(version=1)
        assert clean["sync/verify_s"] > 0 and clean["sync/verified_engines"] == 1 and engine.weight_version == "1"

        def ignore(path: Any, *, version: str | None = None) -> None:  # answers success, loads nothing
            engine.scheduler.weight_version = str(version)

        monkeypatch.setattr(engine.adapters, "load", ignore)
        with torch.no_grad():
            lora_b.add_(0.5)
        with pytest.raises(SyncError) as caught:
            sync.push(version=2)
    finally:
        sync.close()
        engine.close()
    changed = next(
        k for k in load_file(tmp_path / "adapters" / "v2" / "adapter_model.safetensors") if "q_proj.lora_B" in k
    )
    assert ".layers.0." in changed
    assert str(caught.value) == (
        f"weight sync to version 2 failed: {A} (verify): served weights differ from those sent, first at adapter:{changed}"
    )
