"""One wave's rounds: generate its groups, take out unjudged samples, filter, refill.

Round 0 is the wave's quota. With dynamic sampling (DAPO), each further round refills the groups
the filters dropped from their own domains, in proportion, up to `algorithm.max_refill_rounds`.
Every group started ends here (failed, filtered) or in the manager's `take` (stale, trained).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from rlvr.algorithms.filters import keep_group
from rlvr.algorithms.shaping import RewardShaping
from rlvr.collect.episodes import EpisodeRunner
from rlvr.collect.ledger import GroupLedger
from rlvr.collect.prompts import PromptCache
from rlvr.collect.scheduler import Refill, Wave
from rlvr.collect.wave_metrics import group_metrics, merge_reward_metrics
from rlvr.data.adaptive import GroupOutcome
from rlvr.data.mixture import hash_seed
from rlvr.monitor.samples import sample_rows
from rlvr.recipe.schema import Recipe
from rlvr.types import Group


class WaveRounds:
    """Runs a wave's rounds with the manager's parts (`collect` for `WaveScheduler`)."""

    def __init__(
        self,
        recipe: Recipe,
        *,
        prompts: PromptCache,
        episodes: EpisodeRunner,
        ledger: GroupLedger,
        shaping: RewardShaping,
    ) -> None:
        self.recipe = recipe
        self.prompts = prompts
        self.episodes = episodes
        self.ledger = ledger
        self.shaping = shaping

    async def collect(self, wave: Wave, refill: Refill) -> None:
        """Rounds of groups for one step: the first from the quota, then dynamic sampling's refills."""
        algo, per_step = self.recipe.algorithm, self.recipe.data.prompts_per_step
        pending, kept = wave.prompts, wave.kept
        for round_ in range(algo.max_refill_rounds + 1):
            base = self.recipe.experiment.seed * 100_003 + wave.step * 16 + round_
            scores: list[dict[str, float]] = []
            await self.prompts.tokenize(pending)  # off the loop; `fits` and the episodes then read the cache
            groups = await asyncio.gather(
                *(
                    self.episodes.group(s, seed=hash_seed(base, f"{s.id}:{i}"), scores=scores)
                    for i, s in enumerate(self.prompts.fits(pending, dropped=wave.dropped))
                )
            )
            survivors = self._survivors(wave, groups, scores=scores, first=round_ == 0)
            kept += survivors
            missing = per_step - len(kept)
            if not algo.dynamic_sampling or missing <= 0:
                break
            # Refill from the domains whose groups were dropped, in proportion (DAPO's dynamic sampling).
            kept_ids = {id(g) for g in survivors}
            lost = [g.sample.domain for g in groups if id(g) not in kept_ids][:missing]
            pending = await refill(wave.step, lost)
        if algo.dynamic_sampling and len(kept) > per_step:
            self.ledger.end("filtered", kept[per_step:])
            del kept[per_step:]
        wave.metrics["time/rollout"] = time.perf_counter() - wave.started_at
        wave.metrics.update(spread_metrics(wave))

    def _survivors(
        self, wave: Wave, groups: Sequence[Group], *, scores: list[dict[str, float]], first: bool
    ) -> list[Group]:
        """A round's groups that survive: judged (enough samples left) and kept by the filters; the
        others end here. The first round also gives the wave its samples and metrics."""
        if first:  # every episode, failed verdicts included: samples.jsonl says which
            wave.samples = sample_rows(
                groups,
                per_domain=self.recipe.monitor.log_samples,
                step=wave.step + 1,
                prompt_text=self.prompts.prompt_text,
            )
        judged, failed = [], []
        for g in groups:
            (judged if self.ledger.judged_only(g, wave.failures) else failed).append(g)
        self.ledger.end("failed", failed)
        wave.outcomes += [GroupOutcome(g.sample.domain, g.sample.id, tuple(g.scores)) for g in judged]
        wave.generated_tokens += sum(len(c.token_ids) for g in groups for c in g.completions)
        if first:
            wave.metrics.update(merge_reward_metrics(scores))
            wave.metrics.update(group_metrics(judged, tool_domains=self.episodes.toolboxes))
        survivors, dropped = [], []
        for g in judged:
            (survivors if keep_group(self.shaping.shaped_rewards(g), cfg=self.recipe.algorithm) else dropped).append(g)
        self.ledger.end("filtered", dropped)
        return survivors


def spread_metrics(wave: Wave) -> dict[str, float]:
    """Of the wave's judged groups (every round), the share whose samples all scored the same: no
    advantage, so their generation and update teach nothing; and the tokens generated for them all."""
    outcomes = wave.outcomes
    if not outcomes:
        return {}
    out = {"groups/zero_spread_frac": sum(not o.informative for o in outcomes) / len(outcomes)}
    for domain in sorted({o.domain for o in outcomes}):
        mine = [o for o in outcomes if o.domain == domain]
        out[f"zero_spread/{domain}"] = sum(not o.informative for o in mine) / len(mine)
    out["rollout/generated_tokens"] = float(wave.generated_tokens)
    return out
