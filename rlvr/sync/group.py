"""A weight-update process group that lives beside (not inside) torch.distributed's default group.

The trainer already has a default group (torchrun) and a rollout server may be another program
(SGLang), so {trainer rank 0, every engine rank} is a second, independent group, whose store keys
must match the chain SGLang 0.5.23 builds (`init_custom_process_group`). `join_group` (the trainer,
group rank 0) builds that chain by hand from torch's public classes, without torch's rendezvous or
global group state; `join_group_like_sglang` (the embedded engine) builds it as SGLang does, so CI
exercises SGLang's keys. `send_broadcast` is the trainer's half of a bucket; `receive_into` the
engine's into existing tensors, `receive_broadcast` into fresh ones. docs/weight-sync.md has the
key chain and why a simpler one never meets SGLang.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast


@dataclass(slots=True)
class WeightGroup:
    """One member of an update group; holds the store so rank 0's store server outlives the call.

    `backend_group` is the backend that carries this group's tensors (gloo or NCCL);
    `others` keeps objects that own it alive (the ProcessGroup torch's helper wraps it in).
    It also acts as the backend group itself (`broadcast`, `abort`, ... are forwarded).
    """

    backend_group: Any
    store: Any
    rank: int
    world_size: int
    device: str
    others: list[object] = field(default_factory=list[object])

    def broadcast(self, tensors: list[Any], options: Any) -> Any:
        return self.backend_group.broadcast(tensors, options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend_group, name)

    def shutdown(self) -> None:
        """Close every backend of this member (best effort: one may already be broken)."""
        for backend in [self.backend_group, *self.others]:
            for method in ("abort", "shutdown"):
                fn = getattr(backend, method, None)
                if fn is None:
                    continue
                try:
                    fn()
                    break
                except Exception:  # noqa: BLE001, S112 - try the next way; the group is being dropped
                    continue


def backend_device(backend: str) -> str:
    """The device prefix torch's group helper gives a single-backend group's store (gloo: cpu)."""
    import torch.distributed as dist

    devices = list(getattr(dist.Backend, "backend_capability", {}).get(backend, []))
    if not devices:
        raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
    return devices[0]


def group_store(store: Any, group_name: str) -> Any:
    """The store a group's backends see before their device prefix, as SGLang + torch build it."""
    import torch.distributed as dist

    outer = dist.PrefixStore(group_name, store)  # pyright: ignore[reportPrivateImportUsage]
    return dist.PrefixStore(f"{group_name}/", outer)  # pyright: ignore[reportPrivateImportUsage]


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
    """Create this process's member of the update group (the trainer's side; see the module docstring).

    Gloo connects all ranks while constructing each backend (so this returns once everyone
    joined); NCCL connects lazily at the first broadcast. No extra barrier: SGLang's side
    does none, and the trainer must interoperate with it.
    """
    import torch.distributed as dist

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]
        master_address, int(master_port), world_size, is_master=(rank == 0), timeout=timeout, wait_for_workers=False
    )
    prefixed = dist.PrefixStore(  # pyright: ignore[reportPrivateImportUsage]
        f"{backend_device(backend)}/", group_store(store, group_name)
    )
    if backend == "gloo":
        group: Any = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    else:
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    return WeightGroup(group, store, rank, world_size, "cuda" if backend == "nccl" else "cpu")


def join_group_like_sglang(
    *,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str = "weight_update_group",
    backend: str = "gloo",
    timeout_s: float = 600.0,
) -> WeightGroup:
    """An engine's member, built as SGLang 0.5.23 builds it (torch's rendezvous + group helper).

    Calls the same torch functions in the same order as `init_custom_process_group`
    (`sglang/srt/utils/common.py`), so its store keys are SGLang's; the conformance tests
    check that against SGLang's own function.
    """
    import torch
    from torch.distributed import distributed_c10d as c10d

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
    timeout = timedelta(seconds=timeout_s)
    host = f"[{master_address}]" if ":" in master_address else master_address
    # torch's rendezvous and process-group helper are untyped internals SGLang uses too: typed at this edge
    rendezvous = cast(Callable[..., Iterator[tuple[Any, int, int]]], getattr(c10d, "rendezvous"))  # noqa: B009
    store, rank, world_size = next(rendezvous(f"tcp://{host}:{int(master_port)}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    prefixed = c10d.PrefixStore(group_name, store)
    helper = cast(Callable[..., tuple[Any, Any]], getattr(c10d, "_new_process_group_helper"))  # noqa: B009
    pg, _ = helper(world_size, rank, [], c10d.Backend(backend), prefixed, group_name=group_name, timeout=timeout)
    device = "cuda" if backend == "nccl" else "cpu"
    main = pg._get_backend(torch.device(device))
    others = [pg] if main is not pg else []
    return WeightGroup(main, store, rank, world_size, device, others)


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
