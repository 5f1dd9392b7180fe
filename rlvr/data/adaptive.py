"""Where a step's prompts go when groups that teach nothing are known: adaptive shares and pools.

A GRPO group whose samples all score the same has no advantage, so its generation and update
are spent for nothing. `AdaptiveShares` moves each domain's share of a step's prompts with the
recent fraction of its groups that had a reward spread, within the recipe's floor and ceiling;
`DifficultyPool` rests a prompt whose group came back all-correct or all-wrong k times in a row.
Both only read finished groups (`GroupOutcome`) and hold a few numbers of state, so a checkpoint
resumes them exactly. docs/data.md ("Adaptive mix and difficulty pools") has the rules and why.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

SIGNAL_FLOOR = 0.02
"""A domain whose groups all came back alike keeps this much of its signal, so its share falls to
its floor rather than to nothing, and it is still sampled enough to notice when that changes."""


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    """A finished group as the mixture sees it: which prompt, and its samples' scores."""

    domain: str
    sample_id: str
    scores: tuple[float, ...]

    @property
    def informative(self) -> bool:
        """A reward spread: the group has an advantage to learn from."""
        return len(self.scores) > 1 and max(self.scores) > min(self.scores)

    @property
    def verdict(self) -> Literal["solved", "failed", "mixed"]:
        if self.scores and min(self.scores) >= 1.0:
            return "solved"
        if self.scores and max(self.scores) <= 0.0:
            return "failed"
        return "mixed"


def bounded_shares(weights: Mapping[str, float], bounds: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """`weights` normalised to sum 1 with each share kept in its [floor, ceiling]. Domains past a
    bound are pinned to it, the side that is further out first, and the rest share what is left
    in proportion, until none is out (the recipe's bounds admit a mix: floors <= 1 <= ceilings)."""
    pinned: dict[str, float] = {}
    while True:
        free = {d: w for d, w in weights.items() if d not in pinned}
        left, total = 1.0 - sum(pinned.values()), sum(free.values())
        shares = {d: (w / total * left if total > 0 else left / len(free)) for d, w in free.items()}
        low = {d: bounds[d][0] for d, s in shares.items() if s < bounds[d][0]}
        high = {d: bounds[d][1] for d, s in shares.items() if s > bounds[d][1]}
        if not low and not high:
            return {d: pinned.get(d, shares.get(d, 0.0)) for d in weights}
        below = sum(b - shares[d] for d, b in low.items())
        above = sum(shares[d] - b for d, b in high.items())
        pinned.update(low if below >= above else high)
        if len(pinned) == len(weights):
            return dict(pinned)


class AdaptiveShares:
    """Each domain's share: its base probability times a smoothed fraction of informative groups,
    renormalised within its bounds. Starts at the base mix (every signal at 1)."""

    def __init__(self, base: Mapping[str, float], *, bounds: Mapping[str, tuple[float, float]], smoothing: float):
        total = sum(base.values())
        self.base = {d: p / total for d, p in base.items()}
        self.bounds = {d: bounds[d] for d in self.base}
        self.smoothing = smoothing
        self.signal = dict.fromkeys(self.base, 1.0)

    def observe(self, outcomes: Iterable[GroupOutcome]) -> None:
        """One wave's finished groups: each domain's signal moves toward its informative fraction."""
        counts: dict[str, list[int]] = {}
        for outcome in outcomes:
            tally = counts.setdefault(outcome.domain, [0, 0])
            tally[0] += outcome.informative
            tally[1] += 1
        for domain, (informative, groups) in counts.items():
            if domain in self.signal and groups:
                self.signal[domain] += self.smoothing * (informative / groups - self.signal[domain])

    def shares(self) -> dict[str, float]:
        weights = {d: p * max(self.signal[d], SIGNAL_FLOOR) for d, p in self.base.items()}
        return bounded_shares(weights, self.bounds)

    def state_dict(self) -> dict[str, float]:
        return dict(self.signal)

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.signal = {d: float(state[d]) for d in self.base}


class DifficultyPool:
    """One domain's active prompts: a prompt whose group came back all-correct `retire_after` times
    in a row (all-wrong: `retire_failed_after`, by default the same) rests, and comes back after
    `revisit_after` steps, or is drawn at `revisit_rate` each time the walk passes it (the recipe
    sets one of the two)."""

    def __init__(
        self,
        *,
        retire_after: int,
        revisit_after: int | None,
        revisit_rate: float | None,
        seed: int,
        retire_failed_after: int | None = None,
    ):
        self.retire_after = retire_after
        self.retire_failed_after = retire_failed_after or retire_after
        self.revisit_after = revisit_after
        self.revisit_rate = revisit_rate
        self.seed = seed
        self.streaks: dict[str, tuple[str, int]] = {}  # row id -> (verdict, times in a row)
        self.resting: dict[str, tuple[str, int]] = {}  # row id -> (verdict, step it started resting)

    def observe(self, outcome: GroupOutcome, *, step: int) -> None:
        verdict = outcome.verdict
        if verdict == "mixed":
            self.streaks.pop(outcome.sample_id, None)
            return
        last, count = self.streaks.get(outcome.sample_id, (verdict, 0))
        count = count + 1 if last == verdict else 1
        if count >= (self.retire_after if verdict == "solved" else self.retire_failed_after):
            self.resting[outcome.sample_id] = (verdict, step)
            self.streaks.pop(outcome.sample_id, None)
        else:
            self.streaks[outcome.sample_id] = (verdict, count)

    def active(self, sample_id: str, *, step: int, visit: int) -> bool:
        """Is the row drawn when the walk passes it at `step` (its `visit`-th pass)?"""
        rest = self.resting.get(sample_id)
        if rest is None:
            return True
        if self.revisit_after is not None and step - rest[1] >= self.revisit_after:
            del self.resting[sample_id]  # back in the pool, its streak starts again
            return True
        rate = self.revisit_rate or 0.0
        return rate > 0 and random.Random(f"{self.seed}:{sample_id}:{visit}").random() < rate

    def wake_longest_resting(self, rows: list[str], count: int) -> list[str]:
        """`count` of `rows` (the domain's, in walk order) to draw when a whole walk found none
        active: those that have rested longest are the likeliest to have changed (ties go to the
        next in the walk; a row not resting, which a walk across an epoch's end can miss, goes
        last). They are back in the pool before their time, streaks anew."""
        never = float("inf")
        ranked = sorted(rows, key=lambda sample_id: self.resting.get(sample_id, ("", never))[1])
        woken = [ranked[k % len(ranked)] for k in range(count)]
        for sample_id in woken:
            self.resting.pop(sample_id, None)
        return woken

    def counts(self) -> dict[str, int]:
        verdicts = [v for v, _ in self.resting.values()]
        return {"resting_solved": verdicts.count("solved"), "resting_failed": verdicts.count("failed")}

    def state_dict(self) -> dict[str, Any]:
        return {"streaks": sorted(self.streaks.items()), "resting": sorted(self.resting.items())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.streaks = {str(k): (str(v[0]), int(v[1])) for k, v in state["streaks"]}
        self.resting = {str(k): (str(v[0]), int(v[1])) for k, v in state["resting"]}
