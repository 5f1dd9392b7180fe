"""A weight-update process group that lives beside (not inside) torch.distributed's default group.

Why not `init_process_group`: the trainer already has a default group (torchrun), and a
rollout server may be a different program (SGLang); the update group must be a second,
independent group of {trainer rank 0, every engine rank}. We build it from parts:
a TCPStore at master_address:master_port (group rank 0, the trainer, hosts it),
namespaced as `"{group_name}/"` the way torch's own group helper prefixes stores, and a
backend object (gloo on CPU, NCCL on GPU) driven directly, so no global state changes.

Protocol (SGLang's): after `/init_weights_update_group`, each `/update_weights_from_distributed`
call names a bucket of tensors (names, dtypes, shapes); rank 0 broadcasts them one by one
in that order and every engine rank receives and loads them. `send_broadcast` is the
trainer half, used by the tests and available to the sync layer. `receive_into` is the
engine half when the destinations already exist (the embedded engine receives straight
into its live parameters); `receive_broadcast` allocates fresh ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(slots=True)
class WeightGroup:
    """One member of an update group; holds the store so rank 0's store server outlives the call.

    It also acts as the backend group itself (`broadcast`, `abort`, `shutdown`, ... are
    forwarded), so callers can treat it as a plain torch ProcessGroup.
    """

    backend_group: Any
    store: Any
    rank: int
    world_size: int
    device: str

    def broadcast(self, tensors: list[Any], options: Any) -> Any:
        return self.backend_group.broadcast(tensors, options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend_group, name)


def join_group(
    *,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str = "weight_update_group",
    backend: str = "gloo",
    timeout_s: float = 600.0,
) -> WeightGroup:
    """Create this process's member of the update group.

    Gloo connects all ranks while constructing (so this returns once everyone joined);
    NCCL connects lazily at the first broadcast. No extra barrier: SGLang's side does none,
    and the trainer must interoperate with it.
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]
        master_address, int(master_port), world_size, is_master=(rank == 0), timeout=timeout, wait_for_workers=False
    )
    prefixed = dist.PrefixStore(f"{group_name}/", store)  # pyright: ignore[reportPrivateImportUsage]
    if backend == "gloo":
        group: Any = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    elif backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    else:
        raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
    return WeightGroup(group, store, rank, world_size, "cuda" if backend == "nccl" else "cpu")


def torch_dtype(name: str) -> Any:
    """The torch dtype of a `dtypes` entry: "bfloat16" or "torch.bfloat16" -> torch.bfloat16."""
    import torch

    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return value


def receive_broadcast(
    group: WeightGroup, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], *, device: str
) -> list[tuple[str, Any]]:
    """Receive tensors broadcast from group rank 0 in `names` order, into fresh tensors."""
    import torch

    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError(f"names/dtypes/shapes lengths differ: {len(names)}, {len(dtypes)}, {len(shapes)}")
    tensors = [
        torch.empty(tuple(shape), dtype=torch_dtype(dt), device=device)
        for dt, shape in zip(dtypes, shapes, strict=True)
    ]
    receive_into(group, tensors)
    return list(zip(names, tensors, strict=True))


def receive_into(group: WeightGroup, tensors: Sequence[Any]) -> None:
    """Receive broadcasts from group rank 0 into existing `tensors`, in order, in place.

    Every receive is issued before the first wait (one wait per tensor, no Python work
    between transfers). Each tensor must be contiguous (a contiguous view into a larger
    storage, e.g. a slice of a fused QKV weight, is fine: it is written where it lies).
    """
    import torch.distributed as dist

    for tensor in tensors:
        if not tensor.is_contiguous():
            raise ValueError(f"receive target of shape {tuple(tensor.shape)} is not contiguous")
    options = dist.BroadcastOptions()
    options.rootRank = 0
    broadcast = group.backend_group.broadcast
    works = [broadcast([tensor], options) for tensor in tensors]
    for work in works:
        work.wait()


def send_broadcast(group: WeightGroup, tensors: Sequence[Any]) -> None:
    """The rank-0 half: broadcast `tensors` in order (contiguous, on the group's device)."""
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    works = [group.backend_group.broadcast([tensor.contiguous()], options) for tensor in tensors]
    for work in works:
        work.wait()


def dtype_name(dtype: Any) -> str:
    """torch.bfloat16 -> "bfloat16", the form SGLang's `dtypes` field takes."""
    return str(dtype).removeprefix("torch.")
