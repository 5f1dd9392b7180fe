"""Weight fingerprints: per tensor name, an exact checksum of its bytes.

The trainer fingerprints each tensor as it goes on the wire (in the engine's dtype); after the
push every engine fingerprints the weights it serves, and the two must be equal. The checksum is
xxHash's XXH3-128 (the `xxhash` package) of the tensor's bytes in memory order: every byte counts,
tail bytes included, and so does where it is, so two rows, two attention heads or two shards that
changed places change it, as does any changed value; no tolerance is needed, and it costs one read
of the weights. A tensor corrupted in transit, a weight left stale, or a tied head that no longer
follows its embedding changes it. Rollout servers import this module (vLLM's env has `xxhash` too:
scripts/install-vllm.sh).

XXH3 runs on the host. A CPU tensor is hashed where it lies (no copy). A CUDA tensor is copied to
pinned host memory asynchronously, on the current stream (so in order with whatever reuses the
sender's buffer next), and hashed once its copy is done: at the latest in `result()`, earlier when
more than `PENDING_BYTES` of copies are waiting, so the sender never waits for a copy it just
queued and host memory stays bounded. Why not a reduction on the GPU: the sender and the engines
must compute one function whatever their devices (a CUDA trainer pushes to CPU engines and back),
and no maintained hash runs in torch; docs/weight-sync.md ("Verified pushes") has the costs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

Checksum = tuple[int, int, int, int]
"""One tensor's XXH3-128 as four 32-bit words, most significant first: numbers JSON carries exactly."""
Pair = Checksum  # the name older callers import

PENDING_BYTES = 256 << 20
"""Device-to-host copies waiting to be hashed, at most (then the oldest is waited for and hashed)."""


def _raw(tensor: Tensor) -> Tensor:
    """`tensor`'s bytes in memory order, as one flat uint8 tensor on its device."""
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8, device=flat.device)


def host_checksum(raw: Tensor) -> Checksum:
    """XXH3-128 of a flat uint8 CPU tensor's bytes, read in place."""
    import xxhash

    value = xxhash.xxh3_128_intdigest(raw.numpy().data)  # the buffer, read in place
    return (value >> 96, (value >> 64) & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF, value & 0xFFFFFFFF)


def checksum(tensor: Tensor) -> Checksum:
    """`tensor`'s checksum now (a device tensor is copied to the host first: one sync)."""
    return host_checksum(_raw(tensor).cpu())


def fingerprint(tensors: Iterable[tuple[str, Tensor]]) -> dict[str, Checksum]:
    """Every named tensor's checksum; one tensor object under several names (tied) is hashed once."""
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
    """Collects checksums as tensors go by (module docstring: a CUDA tensor's is taken after its
    copy to the host lands). Each `add` reads its tensor: the sender's buffers are reused, so
    storage says nothing of names."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._sums: list[Checksum | None] = []
        self._pending: list[tuple[int, Tensor, Any]] = []  # (index in _sums, pinned host copy, its event)
        self._pending_bytes = 0
        self._aliases: dict[str, str] = {}

    def add(self, name: str, tensor: Tensor) -> None:
        """Record `tensor` under `name` (in the order they come: the comparison's order)."""
        import torch

        raw = _raw(tensor)
        self.names.append(name)
        if raw.device.type != "cuda":
            self._sums.append(host_checksum(raw.cpu()))
            return
        host = torch.empty(raw.numel(), dtype=torch.uint8, pin_memory=True)
        with torch.cuda.device(raw.device):  # the copy and its event on the tensor's device's current stream
            host.copy_(raw, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        self._pending.append((len(self._sums), host, done))
        self._sums.append(None)
        self._pending_bytes += raw.numel()
        while self._pending and self._pending_bytes > PENDING_BYTES:
            self._hash_oldest()

    def _hash_oldest(self) -> None:
        index, host, done = self._pending.pop(0)
        done.synchronize()
        self._sums[index] = host_checksum(host)
        self._pending_bytes -= host.numel()

    def alias(self, name: str, *, of: str) -> None:
        """`name` serves the same tensor as `of` (a tied head the trainer sends once)."""
        self._aliases[name] = of

    def result(self) -> dict[str, Checksum]:
        while self._pending:
            self._hash_oldest()
        out: dict[str, Checksum] = {}
        for name, value in zip(self.names, self._sums, strict=True):
            assert value is not None
            out[name] = value
        for name, source in self._aliases.items():
            if source in out:
                out[name] = out[source]
        return out


def first_difference(sent: Mapping[str, Checksum], served: Mapping[str, Sequence[float]]) -> str | None:
    """The first name of `sent` (in its order) that `served` lacks or holds other values for, else None."""
    for name, words in sent.items():
        other = served.get(name)
        if other is None or len(other) != len(words) or any(int(a) != b for a, b in zip(other, words, strict=True)):
            return name
    return None
