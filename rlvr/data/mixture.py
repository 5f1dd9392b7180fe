"""The multi-domain prompt sampler: each step gets a per-domain quota, seeded and resumable.

Every step each domain earns `p * prompts_per_step` credit and receives the whole part; the
leftover prompts go to the largest remaining credit (ties by domain order), so after k steps each
domain has had within one prompt of `k * p * prompts_per_step` and a small one is never starved
(8 prompts at 0.6/0.3/0.1: 5/2/1, 4/3/1, 5/2/1, 5/3/0, ...). Rows are visited in a seeded
permutation per epoch; the state is a few numbers, so a checkpoint resumes the same sequence.
Waves draw through `WaveDraws`, which fixes where refills and finished groups (the adaptive mix
and difficulty pools of data/adaptive.py) fall in that sequence, whatever the timing.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.data.adaptive import AdaptiveShares, DifficultyPool, GroupOutcome
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

    def take(
        self, count: int, *, pool: DifficultyPool | None = None, step: int = 0, active_only: bool = False
    ) -> list[Sample]:
        """The next `count` rows of the walk; with a `pool`, resting rows are passed over. After a
        whole pass of resting rows the row that has rested longest is woken and drawn, or, with
        `active_only`, the walk stops there and returns fewer (the mixture lends the rest of the
        quota to another domain)."""
        out: list[Sample] = []
        passed = 0
        while len(out) < count:
            if pool is not None and passed >= len(self.samples):
                if not active_only:  # a whole walk found none active: wake the longest-resting
                    ahead = self._order[self.position :] + self._order[: self.position]
                    by_id = {self.samples[i].id: self.samples[i] for i in ahead}
                    out += [by_id[i] for i in pool.wake_longest_resting(list(by_id), count - len(out))]
                break
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            sample = self.samples[self._order[self.position]]
            self.position += 1
            if pool is None or pool.active(sample.id, step=step, visit=self.epoch):
                out.append(sample)
                passed = 0
            else:
                passed += 1
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
        shares: AdaptiveShares | None = None,
        pools: Mapping[str, DifficultyPool] | None = None,
    ):
        self.quotas = QuotaSchedule({n: probs.get(n, 0.0) for n in domains}, prompts_per_step=prompts_per_step)
        self.names = self.quotas.names
        self.streams = {
            name: DomainStream(domains[name], seed=hash_seed(seed, name), shuffle=shuffle) for name in self.names
        }
        self.shares = shares  # data.mix = "adaptive": the quotas follow each domain's learning signal
        self.pools = {name: pool for name, pool in (pools or {}).items() if name in self.streams}
        if shares is not None:
            self._follow_shares()
        self.step = 0

    @property
    def observes(self) -> bool:
        """Whether finished groups change what is drawn next (adaptive shares or difficulty pools)."""
        return self.shares is not None or bool(self.pools)

    def next_batch(self) -> list[Sample]:
        """The step's prompts: each domain's quota of active rows. A domain whose every row rests in
        its difficulty pool lends the rest of its quota to the domains that still have active rows,
        the largest share first; when none has, resting rows are drawn after all (a step is full)."""
        quota = self.quotas.next()
        self.step += 1
        drawn = {name: self._active(name, quota[name]) for name in self.names}
        short = sum(quota.values()) - sum(len(rows) for rows in drawn.values())
        by_share = sorted(self.names, key=lambda n: -self.quotas.probs[n])  # stable: ties in domain order
        open_ = [name for name in by_share if len(drawn[name]) == quota[name]]  # still have active rows
        turn = 0
        while short and open_:  # one prompt at a time, round the domains with active rows
            name = open_[turn % len(open_)]
            more = self._active(name, 1)
            if more:
                drawn[name] += more
                short -= 1
                turn += 1
            else:
                open_.remove(name)
        for name in self.names:  # no active row anywhere: the lenders serve their resting rows
            gap = quota[name] - len(drawn[name])
            if short and gap > 0:
                drawn[name] += self.take(name, min(gap, short))
                short -= min(gap, short)
        return [sample for name in self.names for sample in drawn[name]]

    def _active(self, domain: str, count: int) -> list[Sample]:
        return self.streams[domain].take(count, pool=self.pools.get(domain), step=self.step, active_only=True)

    def take(self, domain: str, count: int) -> list[Sample]:
        """Prompts from one domain: its quota's, or extra ones (dynamic sampling's refill)."""
        return self.streams[domain].take(count, pool=self.pools.get(domain), step=self.step)

    def mix_metrics(self) -> dict[str, float]:
        """The shares the next quota is drawn with and each pool's resting prompts (when enabled)."""
        out: dict[str, float] = {}
        if self.shares is not None:
            out.update({f"mix/{name}": share for name, share in self.quotas.probs.items()})
        for name, pool in self.pools.items():
            out.update({f"pool/{name}/{key}": float(n) for key, n in pool.counts().items()})
        return out

    def observe(self, outcomes: list[GroupOutcome]) -> None:
        """A trained wave's finished groups: the shares and pools move (at a fixed place in the draws)."""
        for outcome in outcomes:
            if (pool := self.pools.get(outcome.domain)) is not None:
                pool.observe(outcome, step=self.step)
        if self.shares is not None:
            self.shares.observe(outcomes)
            self._follow_shares()

    def _follow_shares(self) -> None:
        assert self.shares is not None
        self.quotas.probs = {name: share for name, share in self.shares.shares().items() if name in self.names}

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "step": self.step,
            "credit": dict(self.quotas.credit),
            "streams": {name: stream.state_dict() for name, stream in self.streams.items()},
        }
        if self.shares is not None:
            state["shares"] = self.shares.state_dict()
        if self.pools:
            state["pools"] = {name: pool.state_dict() for name, pool in self.pools.items()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step = int(state["step"])
        self.quotas.credit = {name: float(state["credit"][name]) for name in self.names}
        for name, stream in self.streams.items():
            stream.load_state_dict(state["streams"][name])
        if self.shares is not None and "shares" in state:
            self.shares.load_state_dict(state["shares"])
            self._follow_shares()
        for name, pool in self.pools.items():
            if name in state.get("pools", {}):
                pool.load_state_dict(state["pools"][name])


class WaveDraws:
    """The mixture drawn by asynchronous waves: each wave's quota and its refills at fixed places in
    the stream, so the prompts a step trains never depend on timing.

    Wave s draws its quota Q(s) when admitted and its refills R(s) (dynamic sampling) as its rounds
    need them. With up to k waves ahead of the trainer (k = `ahead`, `rollout.max_staleness`) the
    domain streams always serve them in this order:

        Q(0) .. Q(k), R(0), Q(k+1), R(1), Q(k+2), R(2), ...        (R(s) right before Q(s+k+1))

    Q(s+k+1) is admitted only once wave s is trained, so its refills are final by then. A wave's
    refills wait (the caller's part) until every earlier wave's are final, then draw the quotas up to
    Q(s+k) ahead if they are not drawn yet (a quota depends on the stream's state only). With k = 0
    this is Q(0), R(0), Q(1), R(1), ...: the synchronous loop's order. The quota schedule (each
    domain's share over steps) and the one-permutation-per-epoch walk of each domain are
    `MixtureSampler`'s, untouched: refills are drawn from the same walk, each row once per epoch.

    `state_dict(step)` is the mixture before Q(step) plus the refill counts of the trained waves
    whose draws come after it (waves step-k .. step-1): a resume skips them in their places, so it
    draws exactly what the straight run drew. A wave's finished groups (`finish(s, outcomes)`) reach
    an observing mixture at R(s)'s place too, right before Q(s+k+1), and are kept and resumed alike.
    """

    def __init__(self, mixture: MixtureSampler, *, ahead: int):
        self.mixture = mixture
        self.ahead = ahead
        self.next: int | None = None  # the next wave whose quota is drawn (set by the first draw)
        self.quotas: dict[int, list[Sample]] = {}  # drawn ahead, not yet handed to their wave
        self.marks: dict[int, dict[str, Any]] = {}  # the mixture before Q(s)
        self.refills: dict[int, dict[str, int]] = {}  # per wave, its refill draws per domain
        self.final: set[int] = set()  # waves whose refills are final
        self.replay: dict[int, dict[str, int]] = {}  # from a resume: refill counts to skip before Q(key)
        self.outcomes: dict[int, list[GroupOutcome]] = {}  # per final wave: its groups, for an observing mixture
        self.replay_outcomes: dict[int, list[GroupOutcome]] = {}  # from a resume: observed before Q(key)

    def quota(self, step: int) -> list[Sample]:
        """Wave `step`'s quota (drawn now, or earlier by a refill)."""
        self._draw_through(step)
        self.refills.setdefault(step, {})
        return self.quotas.pop(step)

    def refill(self, step: int, domain: str, count: int) -> list[Sample]:
        """`count` more prompts of `domain` for wave `step`, outside the quota. The caller has waited
        until every earlier wave's refills are final (`finish`)."""
        if any(s < step and s not in self.final for s in self.refills):
            raise RuntimeError(f"wave {step} refills before an earlier wave's refills are final")
        self._draw_through(step + self.ahead)
        counts = self.refills.setdefault(step, {})
        counts[domain] = counts.get(domain, 0) + count
        return self.mixture.take(domain, count)

    def finish(self, step: int, outcomes: list[GroupOutcome] | None = None) -> None:
        """Wave `step` draws no more refills; `outcomes` are its finished groups."""
        self.refills.setdefault(step, {})
        self.final.add(step)
        if self.mixture.observes:
            self.outcomes[step] = list(outcomes or [])

    def forget(self, before: int) -> None:
        """Drop what no `state_dict(step)` with step >= `before` needs."""
        for old in [s for s in self.marks if s < before]:
            del self.marks[old]
        for old in [s for s in self.refills if s < before - self.ahead]:
            del self.refills[old]
            self.final.discard(old)
            self.outcomes.pop(old, None)

    def _draw_through(self, step: int) -> None:
        if self.next is None:
            self.next = step
        while self.next <= step:
            wave = self.next
            before = wave - self.ahead - 1  # R(before) comes right before Q(wave)
            if before in self.refills and before not in self.final:
                raise RuntimeError(f"quota of wave {wave} drawn before wave {before}'s refills are final")
            for domain, count in self.replay.pop(wave, {}).items():
                self.mixture.take(domain, count)
            if self.mixture.observes:
                seen = self.outcomes.get(before) if before in self.final else self.replay_outcomes.pop(wave, None)
                if seen:
                    self.mixture.observe(seen)
            self.marks[wave] = self.mixture.state_dict()
            self.quotas[wave] = self.mixture.next_batch()
            self.next += 1

    def state_dict(self, step: int) -> dict[str, Any]:
        """What resumes at `step`: the mixture before Q(step), and the trained waves' refills after it."""
        live = step not in self.marks  # the mixture now: a wave's outcomes wait until the next quota
        if not live:
            mixture = self.marks[step]
        elif self.next is None or step == self.next:
            mixture = self.mixture.state_dict()
        else:
            raise ValueError(f"no mixture state for step {step} (quotas drawn up to {self.next})")
        later = [(s + self.ahead + 1, c) for s, c in self.refills.items() if s < step < s + self.ahead + 1]
        later += [(at, c) for at, c in self.replay.items() if at > step]
        refills: dict[int, dict[str, int]] = {}
        for at, counts in later:
            for domain, count in counts.items():
                refills.setdefault(at, {})[domain] = refills.get(at, {}).get(domain, 0) + count
        state = {**mixture, "refills": sorted(refills.items())}
        if self.mixture.observes:
            seen = [(s + self.ahead + 1, o) for s, o in self.outcomes.items()
                    if s < step < s + self.ahead + 1 or (live and s + self.ahead + 1 == step)]  # fmt: skip
            seen += [(at, o) for at, o in self.replay_outcomes.items() if at > step]
            state["outcomes"] = [(at, [(g.domain, g.sample_id, list(g.scores)) for g in o]) for at, o in sorted(seen)]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.mixture.load_state_dict(state)
        self.next = None
        self.quotas.clear()
        self.marks.clear()
        self.refills.clear()
        self.final.clear()
        self.replay = {int(at): {str(d): int(n) for d, n in counts.items()} for at, counts in state.get("refills", [])}
        self.outcomes.clear()
        self.replay_outcomes = {
            int(at): [GroupOutcome(str(d), str(i), tuple(float(x) for x in s)) for d, i, s in groups]
            for at, groups in state.get("outcomes", [])
        }


def hash_seed(seed: int, name: str) -> int:
    """A stable per-domain seed (Python's hash() of str changes between processes)."""
    import zlib

    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**31)
