"""The multi-domain prompt sampler: each step gets a per-domain quota, seeded and resumable.

Quotas follow `domain_interleave_probs` exactly in the long run: every step each domain
earns `p * prompts_per_step` credit, receives the whole part, and the leftover prompts go
to the largest remaining credit (ties by domain order). With 8 prompts and 0.6/0.3/0.1 that
gives 5/2/1, 4/3/1, 5/2/1, 5/3/0, ... and after k steps each domain has had within one prompt of
`k * p * prompts_per_step` — unlike independent sampling, a small domain is never starved.

Within a domain rows are visited in a seeded permutation per epoch. The whole state is a
few integers and floats (`state_dict`), so a checkpoint resumes the exact same sequence.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.types import Sample


class DomainStream:
    """Endless, seeded walk over one domain's rows: a fresh permutation every epoch."""

    def __init__(self, samples: Sequence[Sample], *, seed: int, shuffle: bool = True):
        if not samples:
            raise ValueError("a domain needs at least one sample")
        self.samples = samples
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def take(self, count: int) -> list[Sample]:
        out = []
        for _ in range(count):
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            out.append(self.samples[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)


class QuotaSchedule:
    """Per-step prompt counts per domain with carried-over credit (see the module docstring)."""

    def __init__(self, probs: Mapping[str, float], *, prompts_per_step: int):
        self.names = [name for name, p in probs.items() if p > 0.0]
        if not self.names:
            raise ValueError("no domain has a positive interleave probability")
        self.probs = {name: float(probs[name]) for name in self.names}
        self.prompts_per_step = prompts_per_step
        self.credit = dict.fromkeys(self.names, 0.0)

    def next(self) -> dict[str, int]:
        for name in self.names:
            self.credit[name] += self.probs[name] * self.prompts_per_step
        quota = {name: int(self.credit[name] + 1e-9) for name in self.names}
        leftover = self.prompts_per_step - sum(quota.values())
        by_remainder = sorted(self.names, key=lambda n: (-(self.credit[n] - quota[n]), self.names.index(n)))
        for name in by_remainder[:leftover]:
            quota[name] += 1
        for name in self.names:
            self.credit[name] -= quota[name]
        return quota


class MixtureSampler:
    """`next_batch()` returns `prompts_per_step` samples split among domains by quota."""

    def __init__(
        self,
        domains: Mapping[str, Sequence[Sample]],
        *,
        probs: Mapping[str, float],
        prompts_per_step: int,
        seed: int,
        shuffle: bool = True,
    ):
        self.quotas = QuotaSchedule({n: probs.get(n, 0.0) for n in domains}, prompts_per_step=prompts_per_step)
        self.names = self.quotas.names
        self.streams = {
            name: DomainStream(domains[name], seed=hash_seed(seed, name), shuffle=shuffle) for name in self.names
        }
        self.step = 0

    def next_batch(self) -> list[Sample]:
        quota = self.quotas.next()
        self.step += 1
        return [sample for name in self.names for sample in self.streams[name].take(quota[name])]

    def take(self, domain: str, count: int) -> list[Sample]:
        """Extra prompts from one domain (dynamic sampling's refill), outside the quota."""
        return self.streams[domain].take(count)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "credit": dict(self.quotas.credit),
            "streams": {name: stream.state_dict() for name, stream in self.streams.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step = int(state["step"])
        self.quotas.credit = {name: float(state["credit"][name]) for name in self.names}
        for name, stream in self.streams.items():
            stream.load_state_dict(state["streams"][name])


def hash_seed(seed: int, name: str) -> int:
    """A stable per-domain seed (Python's hash() of str changes between processes)."""
    import zlib

    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**31)
