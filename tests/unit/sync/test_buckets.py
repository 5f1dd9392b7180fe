"""The broadcast's bucket plan and packing, the engines' dtype names, and the group's layout, on their own."""

from __future__ import annotations

import pytest
import torch

from rlvr.sync import SyncError
from rlvr.sync.buckets import BucketPlan, engine_dtype
from rlvr.sync.engine_calls import EngineCalls
from rlvr.sync.membership import engine_layout, reachable_address
from rlvr.trainer.weights import iter_full_weights

from .conftest import ParentClient

A, B = "http://10.0.0.1:30000", "http://10.0.0.2:30000"


def test_engine_dtype_names_become_wire_dtypes(model) -> None:
    assert engine_dtype("torch.bfloat16", model) == "bfloat16"
    assert engine_dtype("half", model) == "float16" and engine_dtype("fp32", model) == "float32"
    assert engine_dtype("int8", model) == "" and engine_dtype("auto", model) == ""  # TinyLM has no config


def test_reachable_address_is_loopback_for_local_engines(monkeypatch) -> None:
    monkeypatch.delenv("RLVR_SYNC_MASTER_ADDR", raising=False)
    assert reachable_address(["http://127.0.0.1:30000", "http://localhost:30001"]) == "127.0.0.1"
    monkeypatch.setenv("RLVR_SYNC_MASTER_ADDR", "10.1.2.3")
    assert reachable_address([A]) == "10.1.2.3"


def test_packed_buckets_hold_the_weights_bytes_in_the_wire_dtype(model) -> None:
    plan = BucketPlan(model, bucket_mb=16 * 8 * 2 / 2**20, wire_dtype="bfloat16")  # the bf16 embedding's size
    assert len(plan.buckets) >= 3 and {s.dtype for s in plan.specs} == {"bfloat16"}
    weights = iter_full_weights(model)
    expected = dict(iter_full_weights(model, dtype=torch.bfloat16))
    for i, bucket in enumerate(plan.buckets):
        flat = plan.pack(weights, bucket, slot=i % 2)
        assert torch.equal(flat, torch.cat([expected[s.name].contiguous().view(-1).view(torch.uint8) for s in bucket]))
    assert 1 <= len(plan.flat_buffers) <= 2  # a one-tensor bucket goes as a view of its (cast) tensor
    plan.replan(None)
    assert plan.flat_buffers == [] and {s.dtype for s in plan.specs} == {"float32"}


def test_the_gather_must_follow_the_plan(model) -> None:
    plan = BucketPlan(model, bucket_mb=1, wire_dtype=None)
    shuffled = iter(list(iter_full_weights(model))[::-1])
    with pytest.raises(RuntimeError, match="weight order changed"):
        plan.pack(shuffled, plan.buckets[0], slot=0)


def test_layout_counts_tp_ranks_and_refuses_dp_and_mixed_dtypes(harness, model) -> None:
    calls = EngineCalls(ParentClient([A, B], ranks_per_server=2), timeout_s=5, factory=harness.factory)
    try:
        calls.one(A).info.update(tp_size=4, dtype="bfloat16")
        layout = engine_layout(calls, [A, B], model)
        assert layout.ranks == {A: 4, B: 2} and layout.dtype == "bfloat16" and layout.failures == []
        calls.one(B).info.update(dp_size=2)
        layout = engine_layout(calls, [A, B], model)
        assert list(layout.ranks) == [A] and [f.url for f in layout.failures] == [B]
        assert "dp_size = 2" in layout.failures[0].error
        calls.one(B).info.update(dp_size=1, dtype="float16")
        with pytest.raises(SyncError, match="different dtypes"):
            engine_layout(calls, [A, B], model)
    finally:
        calls.close()
