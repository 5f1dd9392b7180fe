"""What a broadcast push puts on the wire: the bucket plan in the wire dtype, and the packing.

The plan is made from the weights' metadata (`weight_specs`), so a bucket's request can leave
before its tensors are gathered. A flattened bucket is its tensors' bytes back to back: a view
when they already lie so in memory, else a copy into one of two reused buffers, so one bucket
can be packed while the other is on the wire. Per-tensor sends stage each tensor that needs a
cast in a reused buffer of the wire dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rlvr.sync.base import TensorSpec, plan_buckets, weight_specs
from rlvr.weight_arena import back_to_back_bytes

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

Weights = Iterator[tuple[str, "Tensor"]]
"""(name, full tensor) in the order the trainer gathers them (`iter_full_weights`)."""

WIRE_DTYPES = ("float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def engine_dtype(name: str, model: nn.Module) -> str:
    """An engine's dtype name ("bfloat16", "torch.float16", "auto") as a wire dtype ("" if unknown);
    "auto" is the model config's."""
    name = name.removeprefix("torch.")
    if name == "auto":
        config = getattr(model, "config", None)  # a transformers model's; others have none
        value = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None)
        name = str(value).removeprefix("torch.") if value is not None else ""
    name = _DTYPE_ALIASES.get(name, name)
    return name if name in WIRE_DTYPES else ""


def dtype_of(name: str) -> torch.dtype:
    """torch's dtype of a wire dtype name ("bfloat16" -> torch.bfloat16)."""
    import torch

    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


class BucketPlan:
    """The buckets of `model`'s weights at `bucket_mb` MB each, in `wire_dtype` (None: each
    tensor's own), and the reusable buffers their bytes are packed into."""

    def __init__(self, model: nn.Module, *, bucket_mb: float, wire_dtype: str | None) -> None:
        self.model = model
        self.bucket_mb = bucket_mb
        self.observe: Callable[[str, Tensor], None] | None = None  # sees each tensor as sent (verify)
        self.replan(wire_dtype)

    def replan(self, wire_dtype: str | None) -> None:
        """Plan the buckets for tensors cast to `wire_dtype` (None: each tensor's own dtype)."""
        self.wire_dtype = wire_dtype
        self.specs = weight_specs(self.model, dtype=None if wire_dtype is None else dtype_of(wire_dtype))
        self.buckets = plan_buckets(self.specs, bucket_mb=self.bucket_mb)
        self.flat_buffers: list[Tensor] = []
        self.staging: dict[str, Tensor] = {}

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def stage_name(self, index: int) -> str:
        """How failures of bucket `index` are named."""
        return f"update_weights_from_distributed (bucket {index + 1}/{len(self.buckets)})"

    def pack(self, weights: Weights, bucket: list[TensorSpec], *, slot: int) -> Tensor:
        """Gather the bucket's tensors; return their bytes back to back as one uint8 tensor.

        Tensors already back to back in memory (with the wire dtype) are returned as a view;
        otherwise they are copied into buffer `slot` (two alternate, so one can be packed
        while the other is on the wire).
        """
        import torch

        tensors: list[Tensor] = []
        for spec in bucket:
            tensor = next_weight(weights, spec)
            target = dtype_of(spec.dtype)
            tensors.append(tensor if tensor.dtype == target else tensor.to(target))
        view: Tensor | None = back_to_back_bytes(tensors)
        if view is not None:
            return view
        total = sum(s.nbytes for s in bucket)
        device = tensors[0].device
        while len(self.flat_buffers) <= slot:
            largest = max(sum(s.nbytes for s in b) for b in self.buckets)
            self.flat_buffers.append(torch.empty(largest, dtype=torch.uint8, device=device))
        buffer = self.flat_buffers[slot]
        if buffer.device != device:
            buffer = self.flat_buffers[slot] = torch.empty(buffer.numel(), dtype=torch.uint8, device=device)
        offset = 0
        for tensor, spec in zip(tensors, bucket, strict=True):
            buffer[offset : offset + spec.nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
            offset += spec.nbytes
        return buffer[:total]

    def observe_flat(self, bucket: list[TensorSpec], flat: Tensor) -> None:
        """Show `observe` each tensor of a packed bucket as the bytes on the wire: called once its
        broadcast has started, so the trainer's fingerprint reads them while they travel."""
        if self.observe is None:
            return
        offset = 0
        for spec in bucket:
            self.observe(spec.name, flat[offset : offset + spec.nbytes])  # a checksum of bytes: no dtype view
            offset += spec.nbytes

    def stage(self, tensor: Tensor, spec: TensorSpec, offsets: dict[str, int]) -> Tensor:
        """The tensor to send: itself when it already has the wire dtype and layout, else a
        slice of the preallocated flat buffer of that dtype (reused by every bucket)."""
        staged = self._staged(tensor, spec, offsets)
        if self.observe is not None:
            self.observe(spec.name, staged)
        return staged

    def _staged(self, tensor: Tensor, spec: TensorSpec, offsets: dict[str, int]) -> Tensor:
        import torch

        target = dtype_of(spec.dtype)
        if tensor.dtype == target and tensor.is_contiguous():
            return tensor
        numel = tensor.numel()
        start = offsets.get(spec.dtype, 0)
        offsets[spec.dtype] = start + numel
        buffer = self.staging.get(spec.dtype)
        if buffer is None or buffer.device != tensor.device:
            largest = max(sum(s.nbytes for s in b if s.dtype == spec.dtype) for b in self.buckets)
            buffer = torch.empty(largest // spec.itemsize, dtype=target, device=tensor.device)
            self.staging[spec.dtype] = buffer
        view = buffer[start : start + numel].view(spec.shape)
        view.copy_(tensor)
        return view


def next_weight(weights: Weights, spec: TensorSpec) -> Tensor:
    """The next gathered tensor, which must be `spec`'s (the plan and the gather agree on order)."""
    name, tensor = next(weights)
    if name != spec.name:
        raise RuntimeError(f"weight order changed: expected {spec.name}, got {name}")
    return tensor
