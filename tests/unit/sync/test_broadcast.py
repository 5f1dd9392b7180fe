"""BroadcastSync against recording fake engines and a fake group (no sockets)."""

from __future__ import annotations

import pytest
import torch

from rlvr.sync import SyncError, WeightSync
from rlvr.sync.base import plan_buckets, weight_specs
from rlvr.sync.broadcast import BroadcastSync
from rlvr.trainer.weights import iter_full_weights

from .conftest import ParentClient

A, B = "http://10.0.0.1:30000", "http://10.0.0.2:30000"
BUCKET_MB = 16 * 8 * 4 / 2**20  # the embedding's size: the model travels in 3 buckets


def make(harness, model, client, **kw) -> BroadcastSync:
    """Per-tensor wire by default here: one broadcast per tensor makes order and failure
    points easy to see; the flattened format has its own tests below."""
    kw.setdefault("timeout_s", 5)
    kw.setdefault("wire_format", "per_tensor")
    kw.setdefault("bucket_mb", BUCKET_MB)
    kw.setdefault("engine_factory", harness.factory)
    kw.setdefault("join", harness.join)
    return BroadcastSync(model, client=client, master_address="127.0.0.1", backend="gloo", **kw)


def test_order_versions_and_payloads(harness, model) -> None:
    sync = make(harness, model, ParentClient([A]))
    assert isinstance(sync, WeightSync)
    metrics = sync.push(version=3)
    sync.close()
    calls = harness.calls(A)
    buckets = plan_buckets(weight_specs(model), bucket_mb=BUCKET_MB)
    assert len(buckets) == 3
    n = len(buckets)
    assert calls == [
        "init_weights_update_group",
        "pause",
        "flush_cache",
        "begin_weight_update",
        *["update_weights_from_distributed"] * n,
        "end_weight_update",
        "resume",
    ]
    updates = [f for _, m, f in harness.log if m == "update_weights_from_distributed"]
    # version and flush only with the last bucket: an engine never claims weights it lacks
    assert [u["version"] for u in updates] == [None] * (n - 1) + [3]
    assert [u["flush_cache"] for u in updates] == [False] * (n - 1) + [True]
    assert [name for u in updates for name in u["names"]] == [s.name for s in weight_specs(model)]
    shapes = {n: s for u in updates for n, s in zip(u["names"], u["shapes"], strict=True)}
    assert shapes["embed.weight"] == [16, 8] and shapes["scale"] == [8] and updates[0]["dtypes"][0] == "float32"
    # what went over the group is the model's weights, in the announced order
    expected = list(iter_full_weights(model))
    assert len(harness.sent) == len(expected)
    for sent, (_, tensor) in zip(harness.sent, expected, strict=True):
        assert torch.equal(sent, tensor)
    init = next(f for _, m, f in harness.log if m == "init_weights_update_group")
    assert init["world_size"] == 2 and init["rank_offset"] == 1 and init["backend"] == "gloo"
    assert init["master_address"] == "127.0.0.1" and init["group_name"] == harness.groups[0].kw["group_name"]
    assert harness.groups[0].kw["rank"] == 0 and harness.groups[0].kw["world_size"] == 2
    assert metrics["sync/version"] == 3 and metrics["sync/engines"] == 1 and metrics["sync/gb"] > 0


def test_group_is_reused_and_ranks_follow_ranks_per_server(harness, model) -> None:
    sync = make(harness, model, ParentClient([A, B], ranks_per_server=2))
    sync.push(version=1)
    sync.push(version=2)
    sync.close()
    inits = [(u, f) for u, m, f in harness.log if m == "init_weights_update_group"]
    assert [(u, f["rank_offset"], f["world_size"]) for u, f in inits] == [(A, 1, 5), (B, 3, 5)]
    assert len(harness.groups) == 1 and harness.groups[0].aborted  # closed on close()
    assert harness.calls(B).count("resume") == 2


def test_bf16_wire_casts_through_the_reused_staging_buffer(harness, model) -> None:
    sync = make(harness, model, ParentClient([A]), dtype=torch.bfloat16)
    sync.push(version=1)
    first = dict(sync.plan.staging)
    sync.push(version=2)
    assert sync.plan.staging.keys() == {"bfloat16"} and sync.plan.staging["bfloat16"] is first["bfloat16"]
    expected = [t.to(torch.bfloat16) for _, t in iter_full_weights(model)]
    for sent, tensor in zip(harness.sent[len(expected) :], expected, strict=True):
        assert sent.dtype == torch.bfloat16 and torch.equal(sent, tensor)
    sync.close()


@pytest.mark.parametrize("how", ["raise", "refuse"])
def test_fail_mode_names_the_engine(harness, model, how) -> None:
    harness.behave[B] = {"pause": how}
    sync = make(harness, model, ParentClient([A, B]))
    with pytest.raises(SyncError, match=B) as info:
        sync.push(version=1)
    assert [f.url for f in info.value.failures] == [B] and info.value.failures[0].stage == "pause"
    assert "update_weights_from_distributed" not in harness.calls()
    sync.close()


@pytest.mark.timeout(60)
def test_an_engine_that_never_answers_fails_within_the_timeout(harness, model) -> None:
    harness.behave[B] = {"update_weights_from_distributed": "hang"}
    sync = make(harness, model, ParentClient([A, B]), timeout_s=0.5)
    with pytest.raises(SyncError, match=f"{B}.*no answer within 0.5s"):
        sync.push(version=1)
    sync.close()


def test_continue_mode_drops_the_failed_engine_and_retries(harness, model) -> None:
    harness.behave[B] = {"update_weights_from_distributed": "raise"}
    client = ParentClient([A, B])
    sync = make(harness, model, client, on_engine_failure="continue")
    metrics = sync.push(version=4)
    assert metrics["sync/engines"] == 1 and metrics["sync/dropped_engines"] == 1 and metrics["sync/attempts"] == 2
    assert client.live_servers == [A]  # no stale generations from B
    inits = [(u, f["world_size"], f["group_name"]) for u, m, f in harness.log if m == "init_weights_update_group"]
    assert [(u, w) for u, w, _ in inits] == [(A, 3), (B, 3), (A, 2)]
    assert inits[0][2] != inits[2][2]  # a rebuilt group gets a fresh name
    calls = harness.calls(A)
    assert calls[-1] == "resume" and calls.count("resume") == 1
    updates = [f for u, m, f in harness.log if u == A and m == "update_weights_from_distributed"]
    assert updates[-1]["version"] == 4
    harness.engines[B].healthy = False  # still down at the next push
    sync.push(version=5)  # the next push reuses the rebuilt group
    assert len(harness.groups) == 2
    sync.close()


def test_a_dropped_engine_rejoins_only_with_the_current_weights(harness, model) -> None:
    """B fails and is held out of rotation; once it answers /health again it rejoins the next
    push (a new group with both), receives every bucket, and only then serves again."""
    harness.behave[B] = {"update_weights_from_distributed": "raise"}
    client = ParentClient([A, B])
    sync = make(harness, model, client, on_engine_failure="continue")
    sync.push(version=1)
    assert client.live_servers == [A]
    harness.behave[B].clear()  # B is back and healthy
    metrics = sync.push(version=2)
    assert metrics["sync/engines"] == 2 and client.live_servers == [A, B]
    updates = [f for u, m, f in harness.log if u == B and m == "update_weights_from_distributed"]
    assert updates[-1]["version"] == 2 and len(harness.groups) == 3
    assert harness.calls(B)[-2:] == ["end_weight_update", "resume"]
    sync.close()


def test_ranks_and_wire_dtype_come_from_server_info(harness, model) -> None:
    """Each server's tp workers take ranks rank_offset + tp_rank, so offsets follow each tp_size;
    the engines' dtype is the wire dtype (bf16: half the bytes); dp_size > 1 is refused."""
    sync = make(harness, model, ParentClient([A, B]))
    assert sync.calls is not None
    sync.calls.one(A).info.update(tp_size=2, dtype="bfloat16")  # the engine clients the sync will call
    sync.calls.one(B).info.update(tp_size=4, dtype="bfloat16")
    sync.push(version=1)
    inits = [(u, f["rank_offset"], f["world_size"]) for u, m, f in harness.log if m == "init_weights_update_group"]
    assert inits == [(A, 1, 7), (B, 3, 7)]
    updates = [f for _, m, f in harness.log if m == "update_weights_from_distributed"]
    assert {d for u in updates for d in u["dtypes"]} == {"bfloat16"}
    assert all(t.dtype == torch.bfloat16 for t in harness.sent)
    sync.close()
    harness2_model = model
    other = make(harness, harness2_model, ParentClient(["http://10.0.0.3:30000"]))
    assert other.calls is not None
    other.calls.one("http://10.0.0.3:30000").info.update(dp_size=2)
    with pytest.raises(SyncError, match="dp_size = 2"):
        other.push(version=1)
    other.close()


def test_a_broken_broadcast_blames_the_engine_that_lost_its_health(harness, model) -> None:
    harness.fail_broadcast_at = 1
    harness.behave[B] = {"update_weights_from_distributed": "raise"}
    harness.behave[A] = {}
    client = ParentClient([A, B])

    # A also fails the bucket (its receive broke when rank 0 tore the group down) but stays healthy;
    # B answered the health check before the push, then lost its health during the broadcast
    def fail_a_once(url: str):
        engine = harness.factory(url)
        if url == B:
            checks = {"n": 0}

            async def health() -> bool:
                checks["n"] += 1
                if checks["n"] > 1:
                    raise RuntimeError("connection refused")
                return True

            engine.health = health  # type: ignore[method-assign]
        if url == A:
            original = engine.update_weights_from_distributed
            state = {"n": 0}

            async def update(*args, **kw):
                state["n"] += 1
                if state["n"] == 1:
                    raise RuntimeError("Connection closed by peer")
                return await original(*args, **kw)

            engine.update_weights_from_distributed = update  # type: ignore[method-assign]
        return engine

    sync = make(harness, model, client, on_engine_failure="continue", engine_factory=fail_a_once)
    sync.push(version=2)
    assert harness.groups[0].aborted
    assert sync.calls is not None
    assert client.live_servers == [A] and list(sync.calls.dropped) == [B]
    sync.close()


def test_no_engine_left_raises_even_in_continue_mode(harness, model) -> None:
    harness.behave[A] = {"flush_cache": "raise"}
    sync = make(harness, model, ParentClient([A]), on_engine_failure="continue")
    with pytest.raises(SyncError, match="no engine left"):
        sync.push(version=1)
    sync.close()


def test_a_client_is_required_on_rank_0(model) -> None:
    with pytest.raises(ValueError, match="client"):
        BroadcastSync(model, client=None)


def _flat_bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors])


def test_flattened_buckets_are_one_broadcast_of_the_tensors_bytes(harness, model) -> None:
    sync = make(harness, model, ParentClient([A]), wire_format="flattened_bucket")
    sync.push(version=4)
    sync.push(version=5)  # the double buffers are reused: the second push must send the same bytes
    sync.close()
    buckets = plan_buckets(weight_specs(model), bucket_mb=BUCKET_MB)
    updates = [f for _, m, f in harness.log if m == "update_weights_from_distributed"]
    assert len(updates) == 2 * len(buckets)
    assert {u["load_format"] for u in updates} == {"flattened_bucket"}
    assert [u["version"] for u in updates[: len(buckets)]] == [None] * (len(buckets) - 1) + [4]
    weights = dict(iter_full_weights(model))
    expected = [_flat_bytes([weights[s.name] for s in bucket]) for bucket in buckets] * 2
    assert len(harness.sent) == len(expected)
    for sent, want in zip(harness.sent, expected, strict=True):
        assert sent.dtype == torch.uint8 and torch.equal(sent, want)


def test_flattened_bucket_of_back_to_back_tensors_is_sent_without_a_copy(harness) -> None:
    """Weights that already lie back to back (a weight arena) go on the wire from where they are."""
    arena = torch.randn(40)

    class Arena(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(arena[:24].view(3, 8))
            self.b = torch.nn.Parameter(arena[24:].view(2, 8))

    model = Arena()
    sent_pointers: list[int] = []

    original = harness.join

    def join(**kw):
        group = original(**kw)
        real = group.broadcast

        def broadcast(tensors, options):
            sent_pointers.append(tensors[0].data_ptr())
            return real(tensors, options)

        group.broadcast = broadcast
        return group

    sync = make(harness, model, ParentClient([A]), wire_format="flattened_bucket", bucket_mb=1, join=join)
    sync.push(version=1)
    sync.close()
    assert sent_pointers == [arena.data_ptr()]
    assert torch.equal(harness.sent[0], arena.view(torch.uint8))


def test_flattened_bf16_wire_casts_into_the_buffer(harness, model) -> None:
    sync = make(harness, model, ParentClient([A]), wire_format="flattened_bucket", dtype=torch.bfloat16)
    sync.push(version=1)
    sync.close()
    buckets = plan_buckets(weight_specs(model, dtype=torch.bfloat16), bucket_mb=BUCKET_MB)
    weights = dict(iter_full_weights(model, dtype=torch.bfloat16))
    for sent, bucket in zip(harness.sent, buckets, strict=True):
        assert torch.equal(sent, _flat_bytes([weights[s.name] for s in bucket]))


def test_flattened_broken_broadcast_fails_with_the_engine_named(harness, model) -> None:
    harness.fail_broadcast_at = 2
    sync = make(harness, model, ParentClient([A]), wire_format="flattened_bucket")
    with pytest.raises(SyncError) as info:
        sync.push(version=1)
    sync.close()
    assert A in str(info.value)
    assert harness.groups[0].aborted


def test_unknown_wire_format_is_refused(harness, model) -> None:
    with pytest.raises(ValueError, match="wire_format"):
        make(harness, model, ParentClient([A]), wire_format="zip")


def test_an_engine_that_died_idle_is_named_by_the_health_check_before_the_push(harness, model) -> None:
    """fail mode: the push stops before any engine is paused, naming the dead one, which is held."""
    harness.behave[B] = {"health": "raise"}
    client = ParentClient([A, B])
    sync = make(harness, model, client)
    with pytest.raises(SyncError, match=r"10\.0\.0\.2:30000 \(health\): does not answer /health"):
        sync.push(version=1)
    sync.close()
    assert not any(m in ("pause", "begin_weight_update") for _, m, _ in harness.log)  # nobody left half-paused
    assert client.live_servers == [A]  # B is out of rotation


def test_in_continue_mode_a_dead_engine_is_dropped_then_rejoins_with_a_full_push(harness, model) -> None:
    harness.behave[B] = {"health": "raise"}
    client = ParentClient([A, B])
    sync = make(harness, model, client, on_engine_failure="continue")
    sync.push(version=1)
    assert "update_weights_from_distributed" not in harness.calls(B) and client.live_servers == [A]
    harness.behave[B].clear()  # restarted: it answers again
    metrics = sync.push(version=2)
    sync.close()
    updates = [f for url, m, f in harness.log if url == B and m == "update_weights_from_distributed"]
    assert [u["version"] for u in updates][-1] == 2 and len(updates) == 3  # every bucket, then the version
    assert client.live_servers == [A, B] and metrics["sync/engines"] == 2.0
