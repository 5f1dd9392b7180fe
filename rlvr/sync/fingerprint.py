"""Weight fingerprints: per tensor name, an exact checksum of its bytes.

The trainer fingerprints each tensor as it goes on the wire (in the engine's dtype); after the
push every engine fingerprints the weights it serves, and the two must be equal. The checksum is
the wrapping 64-bit sum of the tensor's bytes read as 8-byte words: integer addition does not
depend on the order or thread count that sums it, so no tolerance is needed, any changed value
shows, and it costs one read of the weights. A tensor corrupted in transit, a weight left stale, or
a tied head that no longer follows its embedding changes it. Rollout servers import this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

Pair = tuple[float, float]
"""One tensor's checksum as (high 32 bits, low 32 bits): floats that JSON carries exactly."""


def tensor_pair(tensor: Tensor) -> Tensor:
    """A float64 tensor [high, low] of `tensor`'s checksum, on its device (no host sync)."""
    import torch

    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    cut = raw.numel() // 8 * 8
    head = raw[:cut]
    if head.storage_offset() % 8:  # a weight packed at an odd offset of a shared buffer
        head = head.clone()
    total = head.view(torch.int64).sum() if cut else torch.zeros((), dtype=torch.int64, device=raw.device)
    if cut < raw.numel():
        total = total + raw[cut:].to(torch.int64).sum()
    return torch.stack([torch.div(total, 1 << 32, rounding_mode="floor"), torch.remainder(total, 1 << 32)]).to(
        torch.float64
    )


def fingerprint(tensors: Iterable[tuple[str, Tensor]]) -> dict[str, Pair]:
    """Every named tensor's pair; one tensor object under several names (tied) is summed once."""
    recorder = Fingerprinter()
    items = list(tensors)  # every tensor stays alive meanwhile, so no two share an id()
    first: dict[int, str] = {}
    for name, tensor in items:
        source = first.setdefault(id(tensor), name)
        if source == name:
            recorder.add(name, tensor)
        else:
            recorder.alias(name, of=source)
    return recorder.result()


class Fingerprinter:
    """Collects pairs as tensors go by, converting them to floats once at the end (one host sync).
    Each `add` sums its tensor: the sender's buffers are reused, so storage says nothing of names."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._pairs: list[Tensor] = []
        self._aliases: dict[str, str] = {}

    def add(self, name: str, tensor: Tensor) -> None:
        """Record `tensor` under `name` (in the order they come: the comparison's order)."""
        self.names.append(name)
        self._pairs.append(tensor_pair(tensor))

    def alias(self, name: str, *, of: str) -> None:
        """`name` serves the same tensor as `of` (a tied head the trainer sends once)."""
        self._aliases[name] = of

    def result(self) -> dict[str, Pair]:
        import torch

        if not self._pairs:
            return {}
        flat = torch.stack(self._pairs).cpu().reshape(-1)  # one host transfer for every tensor
        values: list[float] = [float(v) for v in flat]
        out: dict[str, Pair] = {name: (values[2 * i], values[2 * i + 1]) for i, name in enumerate(self.names)}
        for name, source in self._aliases.items():
            if source in out:
                out[name] = out[source]
        return out


def first_difference(sent: Mapping[str, Pair], served: Mapping[str, Sequence[float]]) -> str | None:
    """The first name of `sent` (in its order) that `served` lacks or holds other values for, else None."""
    for name, (high, low) in sent.items():
        pair = served.get(name)
        if pair is None or len(pair) != 2 or (float(pair[0]), float(pair[1])) != (high, low):
            return name
    return None
