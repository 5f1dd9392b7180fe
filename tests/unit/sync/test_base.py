from __future__ import annotations

import pytest
import torch

from rlvr.sync import plan_buckets, resolve_method, weight_specs
from rlvr.sync.base import MB, TensorSpec
from rlvr.trainer.weights import iter_full_weights


def spec(name: str, mb: float) -> TensorSpec:
    return TensorSpec(name, "float32", (int(mb * MB) // 4,), 4)


def test_buckets_keep_order_and_respect_the_limit() -> None:
    specs = [spec("a", 1), spec("b", 1), spec("c", 1), spec("d", 0.5), spec("e", 2)]
    buckets = plan_buckets(specs, bucket_mb=2)
    assert [[s.name for s in b] for b in buckets] == [["a", "b"], ["c", "d"], ["e"]]
    assert [s for b in buckets for s in b] == specs
    assert all(sum(s.nbytes for s in b) <= 2 * MB for b in buckets)


def test_a_tensor_larger_than_a_bucket_travels_alone() -> None:
    buckets = plan_buckets([spec("a", 0.25), spec("big", 5), spec("b", 0.25)], bucket_mb=1)
    assert [[s.name for s in b] for b in buckets] == [["a"], ["big"], ["b"]]


def test_bucket_plan_edge_cases() -> None:
    assert plan_buckets([], bucket_mb=1) == []
    with pytest.raises(ValueError):
        plan_buckets([spec("a", 1)], bucket_mb=0)


def test_specs_match_what_iter_full_weights_yields(model) -> None:
    specs = weight_specs(model)
    full = list(iter_full_weights(model))
    assert [s.name for s in specs] == [n for n, _ in full]  # the tied head appears once
    assert "head.weight" not in [s.name for s in specs]
    for s, (_, t) in zip(specs, full, strict=True):
        assert s.shape == tuple(t.shape) and s.dtype == "float32" and s.nbytes == t.numel() * 4
    half = weight_specs(model, dtype=torch.bfloat16)
    assert {s.dtype for s in half} == {"bfloat16"} and half[0].nbytes == specs[0].nbytes // 2


def test_auto_method() -> None:
    assert resolve_method("auto", has_client=True, has_engine=False) == "broadcast"
    assert resolve_method("auto", has_client=False, has_engine=True) == "inprocess"
    assert resolve_method("disk", has_client=True, has_engine=False) == "disk"
    with pytest.raises(ValueError, match="auto"):
        resolve_method("auto", has_client=False, has_engine=False)


def test_mixed_dtypes_never_give_an_unaligned_offset() -> None:
    """SGLang's FlattenedTensorBucket refuses a tensor whose byte offset is not a multiple of
    its dtype size; a bucket closes before such a tensor."""
    specs = [
        TensorSpec("a", "uint8", (3,), 1),
        TensorSpec("b", "bfloat16", (4,), 2),
        TensorSpec("c", "float32", (2,), 4),
        TensorSpec("d", "uint8", (2,), 1),
        TensorSpec("e", "float32", (1,), 4),
    ]
    buckets = plan_buckets(specs, bucket_mb=1)
    assert [[s.name for s in b] for b in buckets] == [["a"], ["b", "c", "d"], ["e"]]
    for bucket in buckets:
        offset = 0
        for spec in bucket:
            assert offset % spec.itemsize == 0
            offset += spec.nbytes
