"""Process-group setup and the few collectives the trainer needs, safe on one process.

Every helper is a no-op without an initialised process group, so the same actor code runs
under torchrun (gloo on CPU, NCCL on GPU) and in a plain `python` process (strategy "none").
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeGuard, cast

import torch
import torch.distributed as dist

from rlvr.trainer.typed_torch import collectives, float_list
from rlvr.types import RolloutBatch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

# What broadcast_rollout pickles beside the array bytes: the failure line, the batch's domains and
# each flat array's (name, dtype string, element count); no domains and no layout without a batch.
_Header = tuple[str | None, list[str] | None, list[tuple[str, str, int]] | None]


@dataclass(frozen=True, slots=True)
class DistInfo:
    """Where this process sits: rank, world size, and the device its tensors live on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(*, backend: str | None = None, force: bool = False) -> DistInfo:
    """Join the torchrun process group (env `RANK`/`WORLD_SIZE`), or stay single-process.

    gloo on CPU, NCCL when CUDA is available. Without torchrun env vars nothing is
    initialised unless `force` (FSDP2 on one process needs a group: a world-1 gloo group on
    an in-memory store is created then). Idempotent.
    """
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if dist.is_available() and not dist.is_initialized():
        backend = backend or ("nccl" if cuda else "gloo")
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend, device_id=device if cuda else None)
        elif force:
            store = dist.HashStore()  # pyright: ignore[reportPrivateImportUsage]
            dist.init_process_group(backend=backend, store=store, rank=0, world_size=1)
    return DistInfo(rank=rank(), world_size=world_size(), local_rank=local_rank, device=device)


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def all_reduce(values: list[float], *, op: str = "sum", device: torch.device | None = None) -> list[float]:
    """All-reduce a few Python floats in one float64 collective (sum or max)."""
    if not is_dist() or world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device or comm_device())
    collectives.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return float_list(t)


def barrier() -> None:
    if is_dist():
        collectives.barrier()


def exit_process(code: int) -> NoReturn:
    """End a torchrun rank once its work is saved, its group destroyed: flush, then `os._exit`.

    Why skip Python's exit-time teardown: with gloo on CPU, a rank sometimes aborts *after*
    `destroy_process_group` has returned, while the interpreter finalizes ("terminate called
    without an active exception", exit -6, so torchrun reports the run failed). Measured with
    tests/integration/test_sync.py under CPU load: 3 of 40 runs aborted so after printing
    that both ranks had destroyed their groups; 0 of 40 with this exit.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def broadcast_object(obj: object, *, src: int = 0) -> object:
    if not is_dist() or world_size() == 1:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The full tensor: a DTensor's gathered, a plain tensor itself.

    On a one-rank mesh (FSDP2 on one process, as the quickstart trains) the local shard *is*
    the full tensor, so it is returned as is: `full_tensor()` would copy every weight once per
    sync (a tenth of a 1.4 GB push), only for the sync to copy it again into its bucket."""
    if not is_dtensor(tensor):
        return tensor
    if tensor.device_mesh.size() == 1:
        local = tensor.to_local()
        if local.shape == tensor.shape:
            return local
    return tensor.full_tensor()


def is_dtensor(tensor: torch.Tensor) -> TypeGuard[DTensor]:
    """Whether `tensor` is a DTensor (sharded or replicated over a device mesh). Where nothing has
    imported torch.distributed.tensor, which defines the class, none exists: no import then."""
    if "torch.distributed.tensor" not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def broadcast_rollout(
    rollout: RolloutBatch | None, failure: str | None, *, src: int = 0
) -> tuple[RolloutBatch | None, str | None]:
    """The step's batch (and why there is none) from `src` to every rank: the batch's flat arrays
    in one uint8 broadcast, beside a small pickled header (the failure line, the domains, each
    array's dtype and length) — never a pickle of rows of numbers (~10^7 objects per step at
    1024 x 4k tokens, rebuilt on every rank). Receivers' arrays are views into the one buffer."""
    if not is_dist() or world_size() == 1:
        return rollout, failure
    import numpy as np

    arrays = rollout.pack().arrays() if rollout is not None else None
    header: _Header | None = None
    if rank() == src:
        layout: list[tuple[str, str, int]] | None = (
            [(name, a.dtype.str, a.size) for name, a in arrays.items()] if arrays is not None else None
        )
        header = (failure, rollout.domains if rollout is not None else None, layout)
    failure, domains, layout = cast(_Header, broadcast_object(header, src=src))  # src's header
    if layout is None:
        return None, failure
    starts: list[int] = []
    size = 0
    for _, dtype, count in layout:
        size = -(-size // 8) * 8  # every array starts 8-byte aligned: the views below need it
        starts.append(size)
        size += np.dtype(dtype).itemsize * count
    buffer = torch.empty(size, dtype=torch.uint8)
    if arrays is not None:
        flat = buffer.numpy()
        for (name, _, _), start in zip(layout, starts, strict=True):
            raw = np.ascontiguousarray(arrays[name]).view(np.uint8).reshape(-1)
            flat[start : start + raw.size] = raw
    device = comm_device()
    wire = buffer.to(device)
    dist.broadcast(wire, src=src)
    if arrays is not None:
        return rollout, failure
    received = wire.cpu().numpy()
    out = {
        name: received[start : start + np.dtype(dtype).itemsize * count].view(dtype)
        for (name, dtype, count), start in zip(layout, starts, strict=True)
    }
    assert domains is not None  # sent with every layout
    return RolloutBatch.from_arrays(out, domains=domains), failure


def comm_device() -> torch.device:
    """NCCL collectives need CUDA tensors, gloo needs CPU ones."""
    if is_dist() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
