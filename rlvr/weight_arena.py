"""One byte buffer holding every weight of a model, in `state_dict` order (tied weights once).

Why: weight sync sends the weights in exactly that order (`rlvr.trainer.weights.iter_full_weights`),
and SGLang's flattened-bucket wire format is a bucket's tensors' bytes back to back. With the
weights laid out that way on both ends, a bucket *is* a contiguous byte range: the trainer sends it
from where it lies and the embedded engine receives it where it belongs, with no packing copy (on
CPU a copy costs as much as the transfer). q/k/v and gate/up stay adjacent, so the engine's fused
projections are views. Only `.data` moves, so parameters keep their identity; for unsharded models
only. `read_safetensors_into` fills tensors straight from the files with `readinto`, which keeps
the load's peak at the arena itself (docs/weight-sync.md, docs/engines.md).
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def build_weight_arena(model: Any, *, files: Iterable[str | Path] = ()) -> Any:
    """Move `model`'s weights into one uint8 tensor (returned); None, and nothing moved, when a
    dtype would land misaligned (mixed element sizes) or a weight is a DTensor shard.

    `files`: the safetensors files the model was loaded from; every weight found there (same
    name and shape) is read from the file into the arena rather than copied from the model's
    (lazily mapped) tensor, see the module docstring."""
    import torch

    entries: list[Any] = []
    seen: set[int] = set()
    for tensor in model.state_dict(keep_vars=True).values():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            entries.append(tensor)
    if not entries:
        return None
    device = entries[0].device
    size = 0
    for tensor in entries:
        if hasattr(tensor, "full_tensor") or tensor.device != device or size % tensor.element_size():
            log.info("weight arena skipped: sharded, split across devices, or misaligned dtypes")
            return None
        size += tensor.numel() * tensor.element_size()
    arena = torch.empty(size, dtype=torch.uint8, device=device)
    views: list[Any] = []
    offset = 0
    for tensor in entries:
        nbytes = tensor.numel() * tensor.element_size()
        views.append(arena[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape))
        offset += nbytes
    by_id = {id(t): v for t, v in zip(entries, views, strict=True)}
    targets = {name: by_id[id(t)] for name, t in model.state_dict(keep_vars=True).items()}
    loaded = read_safetensors_into(files, targets) if device.type == "cpu" else set()
    done = {id(targets[name]) for name in loaded}
    with torch.no_grad():
        for tensor, view in zip(entries, views, strict=True):
            if id(view) not in done:
                view.copy_(tensor.detach())
            tensor.data = view  # the old (mapped) storage goes as soon as no tensor holds it
    return arena


SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def safetensors_header(path: str | Path) -> tuple[dict[str, Any], int]:
    """(name -> {"dtype", "shape", "data_offsets"}, byte offset of the data) of one file."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


def read_safetensors_into(files: Iterable[str | Path], targets: dict[str, Any]) -> set[str]:
    """Fill `targets` (name -> contiguous CPU tensor) from safetensors files; returns the names filled.

    A tensor stored in the target's dtype is read straight into the target's bytes; another
    dtype is read into a buffer of its own size and cast (one tensor's worth, never the
    model's). Names not in `targets` are skipped; a shape mismatch is a ValueError raised
    before anything is read. Tied aliases (one tensor under two names) are filled once.
    """
    import torch

    plan: list[tuple[Path, int, int, str, Any]] = []
    filled: set[str] = set()
    seen: set[int] = set()
    for path in files:
        header, base = safetensors_header(path)
        for name, info in header.items():
            target = targets.get(name)
            if target is None:
                continue
            if tuple(info["shape"]) != tuple(target.shape):
                raise ValueError(
                    f"{path}: {name} has shape {tuple(info['shape'])}, the model's is {tuple(target.shape)}"
                )
            filled.add(name)
            if id(target) in seen:
                continue
            seen.add(id(target))
            start, end = info["data_offsets"]
            plan.append((Path(path), base + start, end - start, SAFETENSORS_DTYPES[info["dtype"]], target))
    handles: dict[Path, Any] = {}
    try:
        with torch.no_grad():
            for path, offset, nbytes, dtype_name, target in plan:
                f = handles.get(path) or handles.setdefault(path, open(path, "rb"))  # noqa: SIM115
                f.seek(offset)
                dtype = getattr(torch, dtype_name)
                same = dtype == target.dtype and target.is_contiguous()
                buffer = target if same else torch.empty(target.shape, dtype=dtype)
                raw = buffer.view(-1).view(torch.uint8) if buffer.numel() else buffer.view(torch.uint8)
                if raw.numel() != nbytes or nbytes != math.prod(target.shape) * dtype.itemsize:
                    raise ValueError(f"{path}: a tensor of {nbytes} bytes does not fit its header's dtype and shape")
                array: Any = raw.numpy()
                view = memoryview(array).cast("B")
                got = 0
                while got < nbytes:
                    n = f.readinto(view[got:])
                    if not n:
                        raise ValueError(f"{path}: truncated ({got} of {nbytes} bytes)")
                    got += n
                if not same:
                    target.copy_(buffer)
    finally:
        for f in handles.values():
            f.close()
    return filled


def back_to_back_bytes(tensors: list[Any]) -> Any:
    """A uint8 view over `tensors` when each is contiguous and starts where the previous one
    ends, all in one storage (a bucket's worth of an arena); else None."""
    import torch

    first = tensors[0]
    storage = first.untyped_storage()
    position = first.data_ptr()
    for tensor in tensors:
        if not tensor.is_contiguous() or tensor.data_ptr() != position:
            return None
        if tensor.untyped_storage().data_ptr() != storage.data_ptr():
            return None
        position += tensor.numel() * tensor.element_size()
    view = torch.empty(0, dtype=torch.uint8, device=first.device)
    view.set_(storage, first.data_ptr() - storage.data_ptr(), (position - first.data_ptr(),), (1,))
    return view
