"""Two buckets in flight: request i+1 reaches the engine while bucket i is still unanswered.

With a real gloo group and the real embedded engine (the one behind `rlvr serve`): the
engine holds its answer to each bucket until the next bucket's request has arrived (or 5 s
have passed), so a sync that waits for an answer before sending the next request fails
here. The weights must still arrive intact and in bucket order.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import torch

from rlvr.server.embedded import EmbeddedEngine
from rlvr.sync import SyncError
from rlvr.sync.base import plan_buckets, weight_specs
from rlvr.sync.broadcast import BroadcastSync
from rlvr.trainer.weights import iter_full_weights

from .conftest import ParentClient

URL = "http://engine:0"
BUCKET_MB = 0.02  # the tiny model travels in about a dozen buckets
HOLD_S = 5.0


class Spy:
    """The engine as the sync's one-URL client; logs each bucket's request and answer."""

    def __init__(self, engine: EmbeddedEngine, expected: int):
        self.engine = engine
        self.events: list[tuple[str, int]] = []
        self.names: list[list[str]] = []
        self.arrived = [threading.Event() for _ in range(expected + 1)]

    def __getattr__(self, name: str) -> Any:  # pause, resume, begin/end, init group, health
        return getattr(self.engine, name)

    async def flush_cache(self) -> None:
        return None

    async def update_weights_from_distributed(self, names, dtypes, shapes, **kw: Any) -> None:
        index = len(self.names)
        self.names.append(list(names))
        self.events.append(("request", index))
        self.arrived[index].set()
        await self.engine.update_weights_from_distributed(names, dtypes, shapes, **kw)
        self.events.append(("answer", index))

    async def close(self) -> None:  # the engine outlives the sync
        return None


def _hold_answers_until_the_next_request(monkeypatch, spy: Spy, buckets: int) -> list[bool]:
    """After bucket k's bytes are in (engine lock held), wait for request k+1; returns, per
    bucket, whether it came in time."""
    import rlvr.sync.group as rdist

    real = rdist.receive_into
    seen: list[bool] = []

    def receive(group, tensors):
        real(group, tensors)
        k = len(seen) % buckets
        seen.append(True if k == buckets - 1 else spy.arrived[k + 1].wait(HOLD_S))

    monkeypatch.setattr(rdist, "receive_into", receive)
    return seen


def _trainer(model_dir) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        torch.manual_seed(7)
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight))
    return model


@pytest.mark.timeout(120)
def test_request_of_the_next_bucket_arrives_before_the_answer_to_this_one(tiny_model_dir, monkeypatch) -> None:
    engine = EmbeddedEngine(tiny_model_dir, max_batch=2, device="cpu", max_seq_len=32)
    trainer = _trainer(tiny_model_dir)
    buckets = plan_buckets(weight_specs(trainer), bucket_mb=BUCKET_MB)
    assert len(buckets) >= 4
    spy = Spy(engine, len(buckets))
    in_time = _hold_answers_until_the_next_request(monkeypatch, spy, len(buckets))
    sync = BroadcastSync(
        trainer,
        client=ParentClient([URL]),
        master_address="127.0.0.1",
        backend="gloo",
        bucket_mb=BUCKET_MB,
        timeout_s=60,
        engine_factory=lambda url: spy,
    )
    try:
        sync.push(version=3)
    finally:
        sync.close()
        engine.close()

    assert in_time == [True] * len(buckets)  # the engine never waited HOLD_S for a request
    order = {event: i for i, event in enumerate(spy.events)}
    for k in range(len(buckets) - 1):
        assert order[("request", k + 1)] < order[("answer", k)], (
            f"bucket {k + 1}'s request came after bucket {k}'s answer"
        )
    # in bucket order, and intact
    assert spy.names == [[s.name for s in bucket] for bucket in buckets]
    live = dict(engine.model.named_parameters(remove_duplicate=False))
    for name, tensor in iter_full_weights(trainer):
        assert torch.equal(live[name], tensor), name
    assert engine.weight_version == "3"


class Held:
    """A fake engine whose answer to bucket k waits (at most `hold_s`) for request k+1."""

    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self.requests: list[asyncio.Event] = []
        self.waited: list[bool] = []

    async def health(self) -> bool:
        return True

    async def update_weights_from_distributed(self, names, dtypes, shapes, **kw: Any) -> None:
        index = len(self.requests)
        self.requests.append(asyncio.Event())
        self.requests[index].set()
        if kw.get("version") is not None:  # the last bucket: no next request
            return
        deadline = asyncio.get_running_loop().time() + self.hold_s
        while len(self.requests) <= index + 1 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        self.waited.append(len(self.requests) > index + 1)

    def __getattr__(self, name: str) -> Any:
        async def ok(*args: Any, **kw: Any) -> None:
            return None

        return ok


@pytest.mark.parametrize(("backend", "ahead"), [("gloo", True), ("nccl", False)])
def test_only_gloo_sends_the_next_request_before_the_answer(harness, model, backend, ahead) -> None:
    """NCCL's broadcast returns before the engines take it (no proof that request i holds the
    engine), so there each answer is awaited before the next request; gloo's wire is proof."""
    engine = Held(hold_s=0.3)
    sync = BroadcastSync(
        model,
        client=ParentClient([URL]),
        master_address="127.0.0.1",
        backend=backend,
        bucket_mb=16 * 8 * 4 / 2**20,
        timeout_s=5,
        engine_factory=lambda url: engine,
        join=harness.join,
    )
    sync.push(version=1)
    sync.close()
    assert len(engine.requests) == 3
    assert engine.waited == [ahead, ahead]


def _flat(harness, model, client, **kw) -> BroadcastSync:
    return BroadcastSync(
        model,
        client=client,
        master_address="127.0.0.1",
        backend="gloo",
        bucket_mb=16 * 8 * 4 / 2**20,  # three buckets
        timeout_s=5,
        engine_factory=harness.factory,
        join=harness.join,
        on_engine_failure=kw.pop("on_engine_failure", "fail"),
        **kw,
    )


def test_a_refused_bucket_fails_the_push_naming_the_engine_and_bucket(harness, model) -> None:
    """The refusal is read one bucket late (the next request is already out): still named."""
    harness.behave["http://b"] = {"update_weights_from_distributed": "refuse"}
    sync = _flat(harness, model, ParentClient(["http://a", "http://b"]))
    with pytest.raises(SyncError, match=r"http://b \(update_weights_from_distributed \(bucket 1/3\)\): refused"):
        sync.push(version=1)
    assert (
        harness.groups[0].aborted and sync.membership is not None and sync.membership.group is None
    )  # torn down: the next push rebuilds it
    assert "end_weight_update" in harness.calls("http://a") and "resume" not in harness.calls("http://a")
    sync.close()


def test_continue_mode_retries_the_flattened_push_without_the_refusing_engine(harness, model) -> None:
    harness.behave["http://b"] = {"update_weights_from_distributed": "refuse"}
    client = ParentClient(["http://a", "http://b"])
    sync = _flat(harness, model, client, on_engine_failure="continue")
    metrics = sync.push(version=4)
    sync.close()
    assert metrics["sync/attempts"] == 2 and client.live_servers == ["http://a"]
    updates = [f for u, m, f in harness.log if u == "http://a" and m == "update_weights_from_distributed"]
    names = [s.name for s in weight_specs(model)]
    assert [n for u in updates[-3:] for n in u["names"]] == names and updates[-1]["version"] == 4
    assert harness.calls("http://a")[-1] == "resume"
