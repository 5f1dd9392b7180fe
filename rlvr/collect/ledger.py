"""Every group started ends exactly once, as one of GROUP_ENDS, and is counted (`groups/*`).

Samples a reward could not judge leave their group first (a group needs two judged samples to
compare); their share per domain feeds the failure budget, which names why the run should stop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.recipe.schema import Recipe
from rlvr.rewards.budget import FailureBudget, StepFailures
from rlvr.types import GROUP_ENDS, Group


class GroupLedger:
    """The groups in flight, the cumulative counts of how groups ended, and the failure budget."""

    def __init__(self, recipe: Recipe) -> None:
        self.rollout = recipe.rollout
        self.counts: dict[str, int] = dict.fromkeys(("started", *GROUP_ENDS), 0)
        self.live: dict[int, Group] = {}  # groups started that have not ended, by id()
        self.budget = FailureBudget(recipe.rewards.max_failed_frac, recipe.rewards.failure_window)
        self.stop_reason: str | None = None  # set once a domain is past the failure budget

    def start(self, group: Group) -> None:
        self.counts["started"] += 1
        self.live[id(group)] = group

    def end(self, kind: str, groups: Sequence[Group]) -> None:
        """`groups` end as `kind` (one of GROUP_ENDS); each must have started and not ended yet."""
        for group in groups:
            if self.live.pop(id(group), None) is None:
                raise RuntimeError(f"a group of {group.sample.id} ended as {kind} but was not in flight")
        self.counts[kind] += len(groups)

    def cancel_live(self) -> None:
        """Every group still in flight ends as cancelled (the manager closes)."""
        self.end("cancelled", list(self.live.values()))

    def judged_only(self, group: Group, tallies: dict[str, StepFailures]) -> bool:
        """Take the samples that could not be judged out of `group` (in place), counting them;
        whether enough are left to train on: two to compare (one when the recipe samples one)."""
        tally = tallies.setdefault(group.sample.domain, StepFailures())
        for result in group.rewards:
            tally.add(failed=not result.judged, cause=result.failed)
        keep = [i for i, r in enumerate(group.rewards) if r.judged]
        if len(keep) < len(group.rewards):
            group.completions = [group.completions[i] for i in keep]
            group.rewards = [group.rewards[i] for i in keep]
        return len(keep) >= min(2, self.rollout.n)

    def report(self, step: int, failures: dict[str, StepFailures]) -> list[str]:
        """Step `step`'s failed verdicts as events; the failure budget's verdict goes to `stop_reason`."""
        events = [
            f"reward {domain} could not judge {tally.failed} of {tally.total} samples in step {step} "
            f"(not trained on): {tally.cause}"
            for domain, tally in sorted(failures.items())
            if tally.failed
        ]
        self.stop_reason = self.stop_reason or self.budget.observe(step, failures)
        return events

    def load_counts(self, counts: Mapping[str, Any]) -> None:
        """The counts of a checkpoint; the groups in flight or buffered at the save end as cancelled
        (they are dropped on resume)."""
        self.counts.update({k: int(v) for k, v in counts.items() if k in self.counts})
        self.counts["cancelled"] += self.counts["started"] - sum(self.counts[k] for k in GROUP_ENDS)

    def metrics(self) -> dict[str, float]:
        """Cumulative counts of groups started and of each way they ended; groups in flight now."""
        return {**{f"groups/{k}": float(v) for k, v in self.counts.items()}, "groups/in_flight": float(len(self.live))}
