"""`RewardPool`: score every completion of a step concurrently and report per-domain metrics.

Each domain has one reward (a registry name plus its `reward_args`). All calls of a step run as
asyncio tasks at once, and each reward decides where its work happens (math_rule: the shared
process pool of `max_workers`; code_sandbox: sandboxes under a per-core semaphore; llm_judge: HTTP
under a per-URL one). The pool adds a deadline on each call's own time (waits for those slots do not
count: `rewards/deadline.py`); a call that overruns it, raises or returns no number is *failed*
(`rewards/base.py`), never a 0. Metrics: `reward/<domain>/{mean,accuracy,count,failed,timeouts,
errors,latency_p50_s,latency_p95_s}`, mean and accuracy over the judged samples, and `sub/<name>`: the
mean of each named part a reward reports in `info["subscores"]` (a verifiers task's rewards and metrics).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlvr.rewards.base import RewardFn, failed, safe_score
from rlvr.rewards.deadline import own_time
from rlvr.rewards.registry import get_reward
from rlvr.types import Group, RewardResult


@dataclass(slots=True)
class DomainReward:
    name: str
    fn: RewardFn
    args: dict[str, Any] = field(default_factory=dict)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class RewardPool:
    """Scores Groups by their `sample.domain`; fills `group.rewards` in place."""

    def __init__(
        self,
        domains: Mapping[str, DomainReward],
        *,
        max_workers: int | None = None,
        call_timeout_s: float = 120.0,
        threshold: float = 1.0,
    ):
        self.domains = dict(domains)
        self.max_workers = max_workers
        self.call_timeout_s = call_timeout_s
        self.threshold = threshold

    @classmethod
    def from_domains(
        cls,
        domains: Mapping[str, tuple[str, dict[str, Any]]],
        *,
        max_workers: int | None = None,
        call_timeout_s: float = 120.0,
        threshold: float = 1.0,
    ) -> RewardPool:
        """`{domain: (reward_name, reward_args)}`; resolves every reward now so typos fail early."""
        resolved = {
            name: DomainReward(reward, get_reward(reward), dict(args or {})) for name, (reward, args) in domains.items()
        }
        if max_workers and any(d.name == "math_rule" for d in resolved.values()):
            from rlvr.rewards.workers import shared_pool

            shared_pool("math", max_workers=max_workers, preload=("rlvr.rewards.math_rule:_warmup",))
        if max_workers and any(d.name == "verifiers" for d in resolved.values()):
            from rlvr.rewards.verifiers_env import POOL, PRELOAD
            from rlvr.rewards.workers import shared_pool

            shared_pool(POOL, max_workers=max_workers, preload=PRELOAD)  # verifiers imported while rollouts run
        return cls(resolved, max_workers=max_workers, call_timeout_s=call_timeout_s, threshold=threshold)

    async def _one(self, domain: DomainReward, group: Group, index: int) -> tuple[RewardResult, float]:
        start = time.perf_counter()
        try:
            async with own_time(self.call_timeout_s):
                result = await safe_score(domain.fn, group.sample, group.completions[index], **domain.args)
        except TimeoutError:
            result = failed(f"no verdict within the pool's {self.call_timeout_s:g} s deadline", timeout=True)
        return result, time.perf_counter() - start

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        """Score all completions of all groups concurrently; returns per-domain metrics."""
        jobs = []
        for group in groups:
            domain = self.domains.get(group.sample.domain)
            if domain is None:
                raise KeyError(
                    f"group {group.sample.id!r} has domain {group.sample.domain!r}; pool knows {sorted(self.domains)}"
                )
            jobs.extend((group, i, domain) for i in range(len(group.completions)))
        outcomes = await asyncio.gather(*(self._one(domain, group, i) for group, i, domain in jobs))
        results: dict[int, list[RewardResult]] = {id(group): [] for group in groups}
        per_domain: dict[str, list[tuple[RewardResult, float]]] = {}
        for (group, _, _), outcome in zip(jobs, outcomes, strict=True):  # jobs are in completion order
            results[id(group)].append(outcome[0])
            per_domain.setdefault(group.sample.domain, []).append(outcome)
        for group in groups:
            group.rewards = results[id(group)]
        metrics = self._metrics(per_domain)
        judge = sys.modules.get("rlvr.rewards.llm_judge")
        if judge is not None:  # process-wide judge counters, cumulative
            for key, value in judge.JUDGE_METRICS.items():
                metrics[f"reward/judge/{key}_total"] = float(value)
        return metrics

    def _metrics(self, per_domain: dict[str, list[tuple[RewardResult, float]]]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for name, outcomes in sorted(per_domain.items()):
            scores = [r.score for r, _ in outcomes if r.judged]
            latencies = [s for _, s in outcomes]
            prefix = f"reward/{name}/"
            metrics[prefix + "count"] = float(len(scores))
            metrics[prefix + "failed"] = float(len(outcomes) - len(scores))
            if scores:
                metrics[prefix + "mean"] = sum(scores) / len(scores)
                metrics[prefix + "accuracy"] = sum(s >= self.threshold for s in scores) / len(scores)
            metrics[prefix + "timeouts"] = float(sum(bool(r.info.get("timeout")) for r, _ in outcomes))
            metrics[prefix + "errors"] = float(sum(bool(r.info.get("error")) for r, _ in outcomes))
            for key in ("sandbox_reruns", "sandbox_restarts"):  # the sandbox's fork server died and came back
                metrics[prefix + key] = float(sum(int(r.info.get(key, 0)) for r, _ in outcomes))
            subscores: dict[str, list[float]] = {}  # a reward's named parts (a verifiers task's rewards, metrics)
            for r, _ in outcomes:
                if r.judged and isinstance(parts := r.info.get("subscores"), dict):
                    for key, value in parts.items():
                        subscores.setdefault(str(key), []).append(float(value))
            for key, values in sorted(subscores.items()):
                metrics[f"{prefix}sub/{key}"] = sum(values) / len(values)
            metrics[prefix + "latency_p50_s"] = _percentile(latencies, 0.5)
            metrics[prefix + "latency_p95_s"] = _percentile(latencies, 0.95)
        return metrics

    def close(self) -> None:
        """Stop the worker processes this pool's rewards started, and close the judge's HTTP
        sessions (one per judge URL and event loop, kept for the run) — safe to call twice."""
        import sys

        from rlvr.rewards.workers import close_shared_pools

        close_shared_pools()
        judge = sys.modules.get("rlvr.rewards.llm_judge")  # loaded only when a domain judges
        if judge is not None:
            judge.close_sessions()

    async def __aenter__(self) -> RewardPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
