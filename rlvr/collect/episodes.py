"""A group's episodes on the engines and its scores, and held-out evaluation through the same path.

Sample j of a group is seeded `seed + j` (as SGLang-style n-sampling); tool domains run multi-turn
episodes with one tool session per sample (docs/tools.md). Episodes wait at `weights_ready` while a
weight push runs (`rollout.partial`: aborted ones continue afterwards).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence

from rlvr.collect.ledger import GroupLedger
from rlvr.collect.prompts import PromptCache
from rlvr.collect.wave_metrics import IdleClock
from rlvr.data.mixture import hash_seed
from rlvr.evaluation import evaluate_groups
from rlvr.recipe.schema import Recipe
from rlvr.rewards.pool import RewardPool
from rlvr.rollout.base import RolloutClient, SamplingParams
from rlvr.rollout.episode import run_group
from rlvr.tools.session import Toolbox
from rlvr.types import Completion, Group, Sample


class EpisodeRunner:
    """Groups generated on `engine` and scored by `rewards`; each one started in `ledger`."""

    def __init__(
        self,
        recipe: Recipe,
        *,
        client: RolloutClient,
        rewards: RewardPool,
        prompts: PromptCache,
        toolboxes: Mapping[str, Toolbox],
        ledger: GroupLedger,
        idle: IdleClock,
        weights_ready: asyncio.Event,
    ) -> None:
        self.recipe = recipe
        self.client = client
        self.rewards = rewards
        self.prompts = prompts
        self.toolboxes = toolboxes
        self.ledger = ledger
        self.idle = idle
        self.weights_ready = weights_ready  # the staleness gate's: closed while a weight push runs

    def sampling(self, *, seed: int | None) -> SamplingParams:
        r = self.recipe.rollout
        return SamplingParams(
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=r.max_new_tokens,
            stop=list(r.stop),
            stop_token_ids=list(r.stop_token_ids),
            seed=seed,
        )

    async def episodes(
        self, sample: Sample, *, n: int, seed: int | None, temperature: float | None = None
    ) -> list[Completion]:
        """n episodes of one prompt as one group (`run_group`: every request on one server, one
        n-sample request without tools). `temperature` overrides the recipe's (evaluation)."""
        params = self.sampling(seed=seed)
        if temperature is not None:
            params = dataclasses.replace(params, temperature=temperature)
        box = self.toolboxes.get(sample.domain)
        for _ in range(n):
            self.idle.started()
        try:
            return await run_group(
                self.client,
                prompt_ids=self.prompts.prompt_ids(sample),
                params=params,
                n=n,
                partial=self.recipe.rollout.partial,
                weights_ready=self.weights_ready.wait,
                tools=[box.session() for _ in range(n)] if box is not None else None,
                tokenizer=self.prompts.tokenizer,  # the text of a continued response: decoded from all its ids
            )
        finally:
            for _ in range(n):
                self.idle.ended()

    async def group(self, sample: Sample, *, seed: int, scores: list[dict[str, float]]) -> Group:
        """Generate and score one group; scoring starts the moment its own n samples are done."""
        group = Group(sample=sample, completions=[])
        self.ledger.start(group)
        group.completions = await self.episodes(sample, n=self.recipe.rollout.n, seed=seed)
        scores.append(await self.rewards.score_groups([group]))
        return group

    async def evaluate(
        self, evals: Mapping[str, Sequence[Sample]], *, step: int, scored: Callable[[list[Group]], None] | None = None
    ) -> dict[str, float]:
        """Each domain's held-out rows, `eval_n` samples at `eval_temperature` (0: greedy), scored by
        the domain's reward and reported per benchmark tag (`rlvr.evaluation`); `scored` sees the groups."""
        base = self.recipe.experiment.seed * 100_003 + step

        async def generate(samples: list[Sample], n: int, temperature: float) -> list[Group]:
            fits = await asyncio.to_thread(self.prompts.fits, samples)  # tokenizes: off the event loop
            completions = await asyncio.gather(
                *(
                    self.episodes(s, n=n, seed=hash_seed(base, f"eval:{s.id}:{i}"), temperature=temperature)
                    for i, s in enumerate(fits)
                )
            )
            return [Group(sample=s, completions=c) for s, c in zip(fits, completions, strict=True)]

        settings = {name: (d.eval_n, d.eval_temperature) for name, d in self.recipe.domains.items()}
        return await evaluate_groups(evals, generate=generate, rewards=self.rewards, settings=settings, scored=scored)
