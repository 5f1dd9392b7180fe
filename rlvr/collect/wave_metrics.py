"""What a wave reports besides its batch: reward metrics merged over its groups, per-domain group
metrics (lengths, truncation, solve rates, tool use), staleness of what trains, and the share of
time nothing was generating (`IdleClock`)."""

from __future__ import annotations

import time
from collections.abc import Container, Mapping, Sequence

from rlvr.types import Completion, Group


def merge_reward_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Combine the pool's per-group metrics into per-step ones (groups are scored one by one).

    Counts add up; means and accuracies are count-weighted; p50 latency is count-weighted
    (an approximation), p95 the largest; cumulative `_total` counters keep the latest value.
    """
    out: dict[str, float] = {}
    weights: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            prefix = key.rsplit("/", 1)[0]
            count = float(part.get(f"{prefix}/count", 1.0))
            if key.endswith(("/count", "/failed", "/timeouts", "/errors", "/sandbox_reruns", "/sandbox_restarts")):
                out[key] = out.get(key, 0.0) + value
            elif key.endswith("_p95_s"):
                out[key] = max(out.get(key, value), value)
            elif key.endswith("_total"):
                out[key] = value
            else:
                out[key] = out.get(key, 0.0) + value * count
                weights[key] = weights.get(key, 0.0) + count
    for key, weight in weights.items():
        out[key] /= max(weight, 1e-12)
    return out


def group_metrics(groups: Sequence[Group], *, tool_domains: Container[str]) -> dict[str, float]:
    """Per domain: mean response length, truncated share, groups none or all of whose samples
    solved, and tool use for `tool_domains`; the mean reward of every sample."""
    out: dict[str, float] = {}
    by_domain: dict[str, list[Group]] = {}
    for g in groups:
        by_domain.setdefault(g.sample.domain, []).append(g)
    for domain, items in by_domain.items():
        lengths = [len(c.token_ids) for g in items for c in g.completions]
        truncated = [c.finish_reason == "length" for g in items for c in g.completions]
        out[f"response_len/{domain}"] = sum(lengths) / max(len(lengths), 1)
        out[f"truncated/{domain}"] = sum(truncated) / max(len(truncated), 1)
        out[f"solve_none/{domain}"] = sum(max(g.scores) <= 0 for g in items) / len(items)
        out[f"solve_all/{domain}"] = sum(min(g.scores) >= 1 for g in items) / len(items)
        if domain in tool_domains:
            out.update(tool_metrics(domain, [c for g in items for c in g.completions]))
    all_scores = [s for g in groups for s in g.scores]
    out["reward/mean"] = sum(all_scores) / max(len(all_scores), 1)
    return out


def tool_metrics(domain: str, completions: Sequence[Completion]) -> dict[str, float]:
    """Per-episode means (turns, calls, share of episodes calling), per-step sums (errors,
    timeouts) and the mean seconds per call of a tool domain's episodes."""
    stats = [c.tool_stats for c in completions if c.tool_stats]
    if not stats:
        return {}
    n = len(stats)
    calls = sum(s["tool_calls"] for s in stats)
    return {
        f"turns/{domain}": sum(s["turns"] for s in stats) / n,
        f"tools/{domain}/calls_per_episode": calls / n,
        f"tools/{domain}/call_rate": sum(s["tool_calls"] > 0 for s in stats) / n,
        f"tools/{domain}/errors": sum(s["tool_errors"] for s in stats),
        f"tools/{domain}/timeouts": sum(s["tool_timeouts"] for s in stats),
        f"tools/{domain}/latency_s": sum(s["tool_seconds"] for s in stats) / max(calls, 1.0),
    }


def staleness_metrics(groups: Sequence[Group], *, step: int, max_staleness: int) -> dict[str, float]:
    """How many versions behind `step` the oldest token of each trained sample is, and the share of
    samples whose tokens span a weight push."""
    lags = [step - c.oldest_version for g in groups for c in g.completions]
    if not lags:
        return {}
    out = {
        "rollout/staleness_max": float(max(lags)),
        "rollout/staleness_mean": sum(lags) / len(lags),
        "rollout/partial_frac": sum(len(set(c.token_versions)) > 1 for g in groups for c in g.completions) / len(lags),
    }
    for lag in range(max_staleness + 1):
        out[f"rollout/staleness_hist/{lag}"] = sum(x == lag for x in lags) / len(lags)
    return out


class IdleClock:
    """The share of time with no episode in flight, per window between two `idle_frac` calls."""

    def __init__(self) -> None:
        self._active = 0  # episodes in flight
        self._idle_since: float | None = time.perf_counter()
        self._idle_s = 0.0
        self._window_start = time.perf_counter()

    def started(self) -> None:
        if self._active == 0 and self._idle_since is not None:
            self._idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None
        self._active += 1

    def ended(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle_since = time.perf_counter()

    def idle_frac(self) -> float:
        """The idle share since the last call (or since the clock started); starts the next window."""
        now = time.perf_counter()
        idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
        window = max(now - self._window_start, 1e-9)
        self._idle_s, self._window_start = 0.0, now
        if self._idle_since is not None:
            self._idle_since = now
        return min(idle / window, 1.0)
