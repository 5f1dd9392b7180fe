"""The failure budget: stop a run whose rewards cannot judge, instead of training on what is left.

Failed verdicts (a judge that is down, a sandbox that cannot start, a plug-in that raises) are
kept out of training, so a run with a broken reward does not learn wrong things; it learns
nothing, or only from the samples that happened to be judged, while it spends the cluster.
`FailureBudget` watches each domain's failed share over the last `window` steps and names the
first domain past `max_failed_frac`, with the count and the first cause, in the one line the
user reads when the run stops (after its checkpoint).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class StepFailures:
    """One domain's tally in one step: samples scored, how many failed, the first cause."""

    total: int = 0
    failed: int = 0
    cause: str = ""

    def add(self, *, failed: bool, cause: str | None = None) -> None:
        self.total += 1
        if failed:
            self.failed += 1
            self.cause = self.cause or (cause or "")


@dataclass
class FailureBudget:
    max_failed_frac: float
    window: int
    _steps: deque[tuple[int, dict[str, StepFailures]]] = field(default_factory=deque)

    def observe(self, step: int, tallies: dict[str, StepFailures]) -> str | None:
        """Record step `step` (1-based, as the user counts); the stop line if a domain is past the budget."""
        self._steps.append((step, tallies))
        while len(self._steps) > self.window:
            self._steps.popleft()
        if self.max_failed_frac >= 1.0:
            return None
        domains = sorted({d for _, t in self._steps for d in t})
        for domain in domains:
            parts = [(s, t[domain]) for s, t in self._steps if domain in t]
            total = sum(p.total for _, p in parts)
            failed = sum(p.failed for _, p in parts)
            if total and failed and failed / total > self.max_failed_frac:
                first, last = parts[0][0], parts[-1][0]
                steps = f"step {first}" if first == last else f"steps {first}-{last}"
                cause = next((p.cause for _, p in parts if p.cause), "unknown cause")
                return f"reward {domain} could not judge {failed} of {total} samples in {steps}: {cause}"
        return None

    def reset(self) -> None:
        self._steps.clear()
