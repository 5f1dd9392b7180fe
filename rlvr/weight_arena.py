"""One byte buffer holding every weight of a model, in `state_dict` order (tied weights once).

Why: weight sync sends the weights in exactly that order (`rlvr.trainer.weights.iter_full_weights`),
and SGLang's flattened-bucket wire format is a bucket's tensors' bytes back to back. With
the weights laid out that way on both ends, a bucket *is* a contiguous byte range: the
trainer broadcasts it from where it lies and the embedded engine receives it into where
it belongs, with no packing or unpacking copy. (On CPU those copies cost as much as the
transfer itself: memcpy and loopback gloo both run at 10-20 GB/s here.) It also keeps
q/k/v and gate/up adjacent, so the engine's fused projections are views, not copies.

Only `.data` moves: parameters keep their identity, so ties, module references and an
optimizer built afterwards all hold. Used for unsharded models (the rollout engine, the
single-process trainer); FSDP2 shards are left alone (their full tensors are gathered anew
for every sync anyway).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def build_weight_arena(model: Any) -> Any:
    """Move `model`'s weights into one uint8 tensor (returned); None, and nothing moved, when a
    dtype would land misaligned (mixed element sizes) or a weight is a DTensor shard."""
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
    offset = 0
    with torch.no_grad():
        for tensor in entries:
            nbytes = tensor.numel() * tensor.element_size()
            view = arena[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
            view.copy_(tensor.detach())
            tensor.data = view
            offset += nbytes
    return arena


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
