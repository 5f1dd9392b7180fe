"""What every source of a domain's samples shares, files (`sources.py`) and reasoning-gym (`gym.py`)
alike: the error a user sees (`DataError`), the count of what loading left out (`LoadReport`), the
domain's filter (`filtered_out`), and which rewards need a reference answer (`needs_ground_truth`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rlvr.rewards.args import judge_mode
from rlvr.types import Sample


class DataError(Exception):
    """A bad data file or row; `str()` is the one line a user sees (`file:line: reason`)."""


@dataclass
class LoadReport:
    """What loading skipped, so `rlvr plan` and the dashboard can say it."""

    loaded: int = 0
    skipped: int = 0
    filtered: int = 0
    first_skip: str = ""
    reasons: dict[str, int] = field(default_factory=dict)
    repeated: int = 0
    """Generated eval rows left out because a training row has the same question (rlvr/data/gym.py)."""


def filtered_out(sample: Sample, lo: float | None, hi: float | None, max_chars: int | None) -> bool:
    d = sample.difficulty
    if d is not None and ((lo is not None and d < lo) or (hi is not None and d > hi)):
        return True
    return max_chars is not None and sum(len(m["content"]) for m in sample.messages) > max_chars


def kept(
    samples: Iterable[Sample],
    *,
    domain: str,
    lo: float | None,
    hi: float | None,
    max_chars: int | None,
    report: LoadReport,
) -> list[Sample]:
    """The samples the domain's filter keeps (`filtered_out`), each marked as `domain`'s; `report`
    counts the kept and the filtered. One rule for every source of rows (files, reasoning-gym, verifiers)."""
    out: list[Sample] = []
    for sample in samples:
        if filtered_out(sample, lo, hi, max_chars):
            report.filtered += 1
            continue
        sample.domain = domain
        out.append(sample)
    report.loaded += len(out)
    return out


def needs_ground_truth(reward: str, reward_args: dict[str, Any] | None = None) -> bool:
    """Rewards that score 0 on every row without a reference: math_rule, qa_match, and llm_judge
    with the `reference` template (or a custom one that shows the judge {reference})."""
    if reward in ("math_rule", "qa_match"):
        return True
    template = (reward_args or {}).get("template")
    return reward == "llm_judge" and isinstance(template, str) and judge_mode(template) == "reference"
