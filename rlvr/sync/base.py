"""The weight-sync contract: how new trainer weights reach the rollout engines, and in what order.

Every method keeps one order, so the loop can reason about versions: pause generation (abort),
flush the prefix/KV cache (the old weights computed it), push the weights, resume. `push(version=v)`
attaches `v` to the *last* bucket only, so an engine never reports a version whose weights it has
not fully received; every completion carries the version that produced it, per token, and the
rollout manager (`rlvr/collect/`) bounds the lag with `rollout.max_staleness`.

`push` and `close` are called by every trainer rank (gathering FSDP2 shards is collective); only
rank 0 talks to engines and it broadcasts the outcome, so a failed sync raises `SyncError` on every
rank. Every call has a timeout; a failed engine is named by URL and either fails the run or is
dropped (`on_engine_failure`). docs/weight-sync.md says why each step is there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

MB = 1024 * 1024


@runtime_checkable
class WeightSync(Protocol):
    """What the RL loop calls after each train step, on every trainer rank."""

    def push(self, *, version: int) -> dict[str, float]:
        """Make the engines serve the trainer's current weights as `version`; returns metrics."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineFailure:
    """One engine that failed one stage of a sync."""

    url: str
    stage: str
    error: str

    def __str__(self) -> str:
        return f"{self.url} ({self.stage}): {self.error}"


class SyncError(RuntimeError):
    """A weight sync failed; `failures` names the engines (empty when the trainer side failed)."""

    def __init__(self, message: str, failures: Sequence[EngineFailure] = ()):
        super().__init__(message)
        self.failures = list(failures)


@dataclass(frozen=True, slots=True)
class Decision:
    """What trainer rank 0 decided at one step of a sync, as every rank receives it (`agree`)."""

    state: Literal["go", "ok", "retry", "fail"]
    message: str = ""  # fail: the SyncError's message
    failures: tuple[EngineFailure, ...] = ()  # fail: the engines that failed
    wire_dtype: str | None = None  # go (broadcast): the dtype every rank casts to
    engines: int = 0  # ok: engines updated
    dropped: int = 0  # ok: engines dropped so far
    load_s: float = 0.0  # ok (disk): seconds the engines took to load
    verify_s: float = 0.0  # ok: seconds spent fingerprinting and comparing (`sync.verify`)
    verified: int = 0  # ok: engines whose fingerprint was compared and equal (`sync.verify`)

    @classmethod
    def failed(cls, exc: SyncError) -> Decision:
        """The `fail` decision that raises `exc` again on every rank."""
        return cls("fail", str(exc), tuple(exc.failures))


def agree(decision: Decision | None) -> Decision:
    """Trainer rank 0's decision (None elsewhere) on every rank. A `fail` decision raises the same
    SyncError on every rank, so all ranks leave the collective sync together."""
    from rlvr.trainer import dist as d

    agreed = d.broadcast_object(decision)
    assert isinstance(agreed, Decision)
    if agreed.state == "fail":
        raise SyncError(agreed.message, agreed.failures)
    return agreed


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Name, dtype (SGLang's spelling: "float32") and shape of one tensor on the wire."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    itemsize: int

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for dim in self.shape:
            n *= dim
        return n


def weight_specs(model: nn.Module, *, dtype: torch.dtype | None = None, skip_tied: bool = True) -> list[TensorSpec]:
    """The specs of what `rlvr.trainer.weights.iter_full_weights` yields, without communication.

    Why: a bucket's HTTP request (names, dtypes, shapes) must be in flight *before* its
    tensors are gathered and broadcast, so the plan is made from metadata: a DTensor's
    `.shape` is the full (global) shape. Names, order and the tied-weight rule are `iter_full_weights`'s.
    """
    from rlvr.trainer.weights import weight_sources  # HF names for either model implementation

    specs: list[TensorSpec] = []
    for name, tensor, _ in weight_sources(model, skip_tied=skip_tied):
        target = dtype or tensor.dtype
        specs.append(
            TensorSpec(name, str(target).removeprefix("torch."), tuple(int(s) for s in tensor.shape), _itemsize(target))
        )
    return specs


def _itemsize(dtype: torch.dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def plan_buckets(specs: Iterable[TensorSpec], *, bucket_mb: float) -> list[list[TensorSpec]]:
    """Split specs, in order, into buckets of at most `bucket_mb` MB.

    Order is kept (the receiver gets tensors in the order the trainer gathers them); a
    tensor larger than a bucket travels alone in its own bucket; no bucket is empty. A
    tensor whose byte offset in the bucket would not be a multiple of its dtype's size
    starts a new bucket: SGLang's `FlattenedTensorBucket.empty` refuses unaligned offsets
    (only possible with mixed wire dtypes, e.g. a bf16 tensor after an odd count of bytes).
    """
    if bucket_mb <= 0:
        raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
    limit = int(bucket_mb * MB)
    buckets: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if current and (size + spec.nbytes > limit or size % spec.itemsize):
            buckets.append(current)
            current, size = [], 0
        current.append(spec)
        size += spec.nbytes
        if size >= limit:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
