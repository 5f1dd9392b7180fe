"""Weight fingerprints: per tensor name, the float64 sum and sum of squares of its values.

The trainer fingerprints each tensor as it goes on the wire (in the engine's dtype); after the
push every engine fingerprints the weights it serves, and the two are compared. The same bytes
summed in another order (another device, another thread count) give sums that differ in the last
bits, so values are compared with a relative tolerance. A tensor corrupted in transit, a weight
left stale, or a tied head that no longer follows its embedding changes its pair. Rollout servers
import this module (it sits low in the layering): it needs nothing but torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

Pair = tuple[float, float]
"""(sum, sum of squares) of one tensor, in float64."""

RELATIVE_TOLERANCE = 1e-6
# Elements cast to float64 at a time. On CPU a chunk that stays in cache makes the cast, the sum
# and the dot one pass over memory; on a GPU big chunks keep the kernel launches few.
_CPU_CHUNK = 1 << 15
_GPU_CHUNK = 1 << 24


def tensor_pair(tensor: Tensor) -> Tensor:
    """A float64 tensor [sum, sum of squares] of `tensor`, on its device (no host sync)."""
    import torch

    flat = tensor.detach().reshape(-1)
    total = torch.zeros(2, dtype=torch.float64, device=flat.device)
    step = _CPU_CHUNK if flat.device.type == "cpu" else _GPU_CHUNK
    for start in range(0, flat.numel(), step):
        wide = flat[start : start + step].to(torch.float64)
        total[0] += wide.sum()
        total[1] += torch.dot(wide, wide)
    return total


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


def close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE_TOLERANCE * max(1.0, abs(a), abs(b))


def first_difference(sent: Mapping[str, Pair], served: Mapping[str, Sequence[float]]) -> str | None:
    """The first name of `sent` (in its order) that `served` lacks or holds other values for, else None."""
    for name, (total, squares) in sent.items():
        pair = served.get(name)
        if pair is None or len(pair) != 2 or not (close(total, pair[0]) and close(squares, pair[1])):
            return name
    return None
