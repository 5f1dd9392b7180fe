"""`samples.jsonl`: a few whole episodes per step, so a user can read what the model did.

Metrics say *that* the reward moved; an episode says *why*: whether the model called the tool,
what the tool answered, what it wrote after. `monitor.log_samples` episodes per domain are written
each step (0: none), one JSON object per line: the exact prompt the model saw, the whole episode's
text as the reward read it, the reward, its verdict and reason, and for tool domains the turns and
tool calls (the fields: docs/monitoring.md). Episodes are taken round-robin over the step's groups
(the first sample of each group, then the second, ...), so different prompts come first and the
choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlvr.types import Group, Sample

_STATS = ("turns", "tool_calls", "tool_errors", "tool_timeouts")


def sample_rows(
    groups: Sequence[Group], *, per_domain: int, step: int, prompt_text: Callable[[Sample], str]
) -> list[dict[str, Any]]:
    """Up to `per_domain` episodes of each domain, in the order the groups came."""
    by_domain: dict[str, list[Group]] = {}
    for group in groups:
        by_domain.setdefault(group.sample.domain, []).append(group)
    rows: list[dict[str, Any]] = []
    for domain, items in by_domain.items():
        width = max(len(g.completions) for g in items)
        picked = [(g, i) for i in range(width) for g in items if i < len(g.completions)][:per_domain]
        for group, i in picked:
            c = group.completions[i]
            result = group.rewards[i] if i < len(group.rewards) else None
            row: dict[str, Any] = {
                "step": step,
                "domain": domain,
                "id": group.sample.id,
                "prompt": prompt_text(group.sample),
                "completion": c.text,
                "reward": None if result is None or not result.judged else result.score,
                "verdict": None if result is None else ("scored" if result.judged else "failed"),
                "reason": None if result is None else str(result.info.get("reason", result.failed or "")),
                "finish_reason": c.finish_reason,
                "tokens": len(c.token_ids),
            }
            truth = group.sample.ground_truth if group.sample.ground_truth is not None else group.sample.test_cases
            if truth is not None:
                row["ground_truth"] = truth if isinstance(truth, str | int | float | list | dict) else str(truth)
            row.update({k: int(c.tool_stats[k]) for k in _STATS if k in c.tool_stats})
            if c.own_text is not None:
                row["own_text"] = c.own_text  # what the reward read: the model's turns, no tool answers
            rows.append(row)
    return rows
