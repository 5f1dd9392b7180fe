"""Trainer rank 0's side job: draw prompts, sample groups, score them, shape the batch.

The controller owns everything that is not tensors: the data mixture, the HTTP rollout
client, the reward pool, per-domain reward normalisation and the group filters (dynamic
sampling with refill, overlong shaping). `collect()` returns plain Python data that rank 0
broadcasts to the other trainer ranks, which only ever see token ids and floats.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.algorithms.filters import keep_group, soft_overlong_penalty
from rlvr.data.chat import encode_prompt
from rlvr.data.mixture import MixtureSampler, hash_seed
from rlvr.recipe.schema import Recipe
from rlvr.rewards.pool import RewardPool
from rlvr.rollout.engine import GenerateRequest, RolloutEngine, SamplingParams
from rlvr.types import Group, Sample


@dataclass
class RolloutBatch:
    """What every trainer rank needs from a step's rollouts (picklable, no torch)."""

    prompts: list[list[int]] = field(default_factory=list)
    responses: list[list[int]] = field(default_factory=list)
    rollout_logprobs: list[list[float]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    loss_masks: list[float] = field(default_factory=list)
    group_ids: list[int] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.responses)

    def add_group(self, group: Group, rewards: Sequence[float], masks: Sequence[float], group_id: int) -> None:
        for completion, reward, mask in zip(group.completions, rewards, masks, strict=True):
            self.prompts.append(list(completion.prompt_token_ids))
            self.responses.append(list(completion.token_ids))
            self.rollout_logprobs.append(list(completion.logprobs))
            self.rewards.append(float(reward))
            self.loss_masks.append(float(mask))
            self.group_ids.append(group_id)
            self.domains.append(group.sample.domain)


class RunningDomainStats:
    """Running mean/std of one domain's raw rewards (reward_norm = "domain"), resumable."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, values: Sequence[float]) -> None:
        for value in values:  # Welford: exact and stable
            self.count += 1
            delta = value - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (value - self.mean)

    def normalize(self, value: float) -> float:
        std = (self.m2 / (self.count - 1)) ** 0.5 if self.count > 1 else 1.0
        return (value - self.mean) / (std + 1e-6)

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


class Controller:
    def __init__(
        self,
        recipe: Recipe,
        *,
        train: Mapping[str, Sequence[Sample]],
        evals: Mapping[str, Sequence[Sample]],
        tokenizer: Any,
        engine: RolloutEngine,
        rewards: RewardPool,
    ):
        self.recipe = recipe
        self.tokenizer = tokenizer
        self.engine = engine
        self.rewards = rewards
        self.evals = evals
        self.mixture = MixtureSampler(
            train,
            probs=recipe.data.domain_interleave_probs,
            prompts_per_step=recipe.data.prompts_per_step,
            seed=recipe.experiment.seed,
            shuffle=recipe.data.shuffle,
        )
        self.domain_stats = {
            name: RunningDomainStats() for name, d in recipe.domains.items() if d.reward_norm == "domain"
        }
        self._prompt_ids: dict[tuple[str, str], list[int]] = {}
        self.policy_version = 0
        self.loop = asyncio.new_event_loop()

    # -- prompts -> groups ---------------------------------------------------------------------
    def prompt_ids(self, sample: Sample) -> list[int]:
        key = (sample.domain, sample.id)
        if key not in self._prompt_ids:
            self._prompt_ids[key] = encode_prompt(
                sample.messages, tokenizer=self.tokenizer, template=self.recipe.model.chat_template
            )
        return self._prompt_ids[key]

    def sampling(self, *, seed: int | None, greedy: bool = False) -> SamplingParams:
        r = self.recipe.rollout
        return SamplingParams(
            temperature=0.0 if greedy else r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=r.max_new_tokens,
            stop=list(r.stop),
            stop_token_ids=list(r.stop_token_ids),
            seed=seed,
        )

    async def _groups(self, samples: Sequence[Sample], *, step: int, n: int, greedy: bool = False) -> list[Group]:
        fits = [s for s in samples if len(self.prompt_ids(s)) <= self.recipe.data.max_prompt_tokens]
        requests = [
            GenerateRequest(
                input_ids=self.prompt_ids(s),
                params=self.sampling(
                    seed=hash_seed(self.recipe.experiment.seed * 100_003 + step, f"{s.id}:{i}"), greedy=greedy
                ),
                n=n,
            )
            for i, s in enumerate(fits)
        ]
        completions = await self.engine.generate(requests)
        return [Group(sample=s, completions=completions[i * n : (i + 1) * n]) for i, s in enumerate(fits)]

    # -- the step's rollouts -----------------------------------------------------------------------
    def collect(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        return self.loop.run_until_complete(self._collect(step))

    async def _collect(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        algo, n = self.recipe.algorithm, self.recipe.rollout.n
        timings = {"rollout": 0.0, "reward": 0.0}
        metrics: dict[str, float] = {}
        pending = self.mixture.next_batch()
        kept: list[Group] = []
        dropped = 0
        for round_ in range((algo.max_refill_rounds or 0) + 1):
            start = time.perf_counter()
            groups = await self._groups(pending, step=step * 16 + round_, n=n)
            timings["rollout"] += time.perf_counter() - start
            start = time.perf_counter()
            scored = await self.rewards.score_groups(groups)
            timings["reward"] += time.perf_counter() - start
            if round_ == 0:
                metrics.update(scored)
                metrics.update(self._group_metrics(groups))
            survivors = [g for g in groups if keep_group(self.shaped_rewards(g), cfg=algo)]
            dropped += len(groups) - len(survivors)
            kept += survivors
            missing = self.recipe.data.prompts_per_step - len(kept)
            if not algo.dynamic_sampling or missing <= 0:
                break
            # Refill from the domains whose groups were dropped, in proportion (DAPO's dynamic sampling).
            kept_ids = {id(g) for g in survivors}
            lost = [g.sample.domain for g in groups if id(g) not in kept_ids][:missing]
            pending = [s for domain in lost for s in self.mixture.take(domain, 1)]
        batch = self.build_batch(kept[: self.recipe.data.prompts_per_step] if algo.dynamic_sampling else kept)
        metrics.update(
            {
                "batch/groups_dropped": float(dropped),
                "batch/groups_kept": float(len(kept)),
                "batch/sequences": float(len(batch)),
                "time/rollout": timings["rollout"],
                "time/reward": timings["reward"],
            }
        )
        return batch, metrics

    def shaped_rewards(self, group: Group) -> list[float]:
        """Scores plus DAPO's soft overlong penalty (the filters and advantages see these)."""
        algo, r = self.recipe.algorithm, self.recipe.rollout
        if not algo.overlong_buffer:
            return group.scores
        return [
            score
            + soft_overlong_penalty(
                len(c.token_ids),
                max_new_tokens=r.max_new_tokens,
                buffer=algo.overlong_buffer,
                penalty=algo.overlong_penalty or 0.0,
            )
            for score, c in zip(group.scores, group.completions, strict=True)
        ]

    def build_batch(self, groups: Sequence[Group]) -> RolloutBatch:
        batch = RolloutBatch()
        for group_id, group in enumerate(groups):
            rewards = self.shaped_rewards(group)
            stats = self.domain_stats.get(group.sample.domain)
            if stats is not None:
                stats.update(rewards)
                rewards = [stats.normalize(x) for x in rewards]
            masks = [
                0.0 if (self.recipe.algorithm.overlong_mask and c.finish_reason == "length") or not c.token_ids else 1.0
                for c in group.completions
            ]
            batch.add_group(group, rewards, masks, group_id)
        return batch

    def _group_metrics(self, groups: Sequence[Group]) -> dict[str, float]:
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
        all_scores = [s for g in groups for s in g.scores]
        out["reward/mean"] = sum(all_scores) / max(len(all_scores), 1)
        versions = [c.policy_version for g in groups for c in g.completions]
        if versions:
            out["rollout/staleness_max"] = float(self.policy_version - min(versions))
        return out

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy answers to every held-out prompt, scored by the domain's reward."""
        return self.loop.run_until_complete(self._evaluate(step))

    async def _evaluate(self, step: int) -> dict[str, float]:
        from dataclasses import replace

        from rlvr.evaluation import evaluate_groups

        async def generate(samples: list[Sample], n: int, temperature: float) -> list[Group]:
            fits = [s for s in samples if len(self.prompt_ids(s)) <= self.recipe.data.max_prompt_tokens]
            base = self.recipe.experiment.seed * 100_003 + step
            requests = [
                GenerateRequest(
                    input_ids=self.prompt_ids(s),
                    params=replace(self.sampling(seed=hash_seed(base, f"eval:{s.id}:{i}")), temperature=temperature),
                    n=n,
                )
                for i, s in enumerate(fits)
            ]
            completions = await self.engine.generate(requests)
            return [Group(sample=s, completions=completions[i * n : (i + 1) * n]) for i, s in enumerate(fits)]

        settings = {name: (d.eval_n, d.eval_temperature) for name, d in self.recipe.domains.items()}
        return await evaluate_groups(self.evals, generate=generate, rewards=self.rewards, settings=settings)

    # -- weight versions and state --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "mixture": self.mixture.state_dict(),
            "domain_stats": {k: v.state_dict() for k, v in self.domain_stats.items()},
            "policy_version": self.policy_version,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.mixture.load_state_dict(state["mixture"])
        for name, stats in self.domain_stats.items():
            stats.load_state_dict(state["domain_stats"][name])
        self.policy_version = int(state["policy_version"])

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            self.loop.run_until_complete(close())
        self.rewards.close()
        self.loop.close()
