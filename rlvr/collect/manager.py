"""Trainer rank 0's rollout manager: generation, rewards and filters that never wait for training.

`RolloutManager` runs on its own thread and event loop (HTTP only, never a collective). It draws
each step's prompts from the mixture as a *wave*, runs one episode per sample, scores each group
the moment its samples finish, applies the group filters and refills as groups arrive, and buffers
finished waves until the trainer takes them:

    wave s is admitted once the engines serve version >= s - k      (k = rollout.max_staleness)
    take(s) returns wave s's groups, every token from version >= s - k (re-checked: stale ones dropped)

k = 0 is exactly the synchronous loop. Every group started ends exactly once (`groups/*`); samples a
reward could not judge leave their group first. Prompts follow the seed, never timing (docs/async.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlvr.algorithms.shaping import RewardShaping
from rlvr.bridge import LoopThread
from rlvr.collect.episodes import EpisodeRunner
from rlvr.collect.ledger import GroupLedger
from rlvr.collect.prompts import PromptCache
from rlvr.collect.rounds import WaveRounds
from rlvr.collect.scheduler import Wave, WaveScheduler
from rlvr.collect.wave_metrics import IdleClock, staleness_metrics
from rlvr.data.adaptive import AdaptiveShares, DifficultyPool
from rlvr.data.mixture import MixtureSampler, WaveDraws, hash_seed
from rlvr.monitor.samples import sample_rows
from rlvr.recipe.schema import Recipe
from rlvr.rewards.pool import RewardPool
from rlvr.rollout.base import RolloutClient
from rlvr.rollout.pool import ServerPool
from rlvr.tools.session import Toolbox
from rlvr.types import Group, RolloutBatch, Sample


class RolloutManager:
    """Rank 0's rollout side (see the module docstring), composed of one part per job (`rlvr.collect`).
    Its state lives on its own event loop; the trainer thread reaches it only through `start`,
    `take`, `pause`, `resume`, `evaluate`, `state_dict` and `close`, which run there and wait."""

    def __init__(
        self,
        recipe: Recipe,
        *,
        train: Mapping[str, Sequence[Sample]],
        evals: Mapping[str, Sequence[Sample]],
        tokenizer: Any,
        client: RolloutClient,
        rewards: RewardPool,
    ):
        self.recipe = recipe
        self.evals = evals
        self.max_staleness = recipe.rollout.max_staleness
        self.mixture = MixtureSampler(
            train,
            probs=recipe.data.domain_interleave_probs,
            prompts_per_step=recipe.data.prompts_per_step,
            seed=recipe.experiment.seed,
            shuffle=recipe.data.shuffle,
            shares=adaptive_shares(recipe),
            pools=difficulty_pools(recipe),
        )
        self.draws = WaveDraws(self.mixture, ahead=self.max_staleness)
        # Domains with tools run multi-turn episodes (docs/tools.md); a bad tool fails here, at start.
        self.toolboxes = {
            name: Toolbox.for_domain(
                d,
                tokenizer=tokenizer,
                default_tokens=recipe.rollout.max_new_tokens,
                chat_template=recipe.model.chat_template,
            )  # fmt: skip
            for name, d in recipe.domains.items()
            if d.tools
        }
        self.shaping = RewardShaping(
            recipe.algorithm,
            rollout=recipe.rollout,
            episode_tokens={name: box.max_tokens for name, box in self.toolboxes.items()},
            normalized=[name for name, d in recipe.domains.items() if d.reward_norm == "domain"],
        )
        eval_rows = max(map(len, evals.values()), default=0)
        self.prompts = PromptCache(recipe, tokenizer=tokenizer, toolboxes=self.toolboxes, eval_rows=eval_rows)
        self.ledger = GroupLedger(recipe)
        self.idle = IdleClock()
        self.bridge = LoopThread(name="rlvr-rollout")
        self.loop = self.bridge.loop
        weights_ready = asyncio.Event()  # closed only while a weight push runs
        weights_ready.set()
        self.episodes = EpisodeRunner(recipe, client=client, rewards=rewards, prompts=self.prompts,
                                      toolboxes=self.toolboxes, ledger=self.ledger, idle=self.idle,
                                      weights_ready=weights_ready)  # fmt: skip
        rounds = WaveRounds(recipe, prompts=self.prompts, episodes=self.episodes, ledger=self.ledger,
                            shaping=self.shaping)  # fmt: skip
        self.scheduler = WaveScheduler(recipe, draws=self.draws, loop=self.loop, weights_ready=weights_ready,
                                       collect=rounds.collect)  # fmt: skip
        self._samples: list[dict[str, Any]] = []  # the last taken wave's, for samples.jsonl
        self._events: list[str] = []  # warnings for events.jsonl, popped by the loop with the samples

    # -- the trainer's side (any thread) -------------------------------------------------------
    def start(self, *, version: int) -> None:
        """Start the manager's thread; waves from `version` on, as far as the bound allows."""
        self.bridge.start()
        self.bridge.call(self.scheduler.open_gate(version, first_wave=version))

    def take(
        self, step: int, *, while_waiting: Callable[[], None] | None = None, poll_s: float = 2.0
    ) -> tuple[RolloutBatch, dict[str, float]]:
        """Block until wave `step` is complete; its batch and metrics (the trainer is at `step`).
        `while_waiting()` runs on the caller's thread every `poll_s` until then; what it raises
        gives the wave up."""
        if while_waiting is None or not self.bridge.started:
            return self.bridge.call(self._take(step))
        future = self.bridge.submit(self._take(step))
        while True:
            try:
                return future.result(timeout=poll_s)
            except cf.TimeoutError:
                try:
                    while_waiting()
                except BaseException:  # the caller gives the wave up (a stop): stop waiting for it
                    future.cancel()
                    raise

    def stranded(self) -> bool:
        """Every server is held and one answers again: the wave waits for a push (`ServerPool.stranded`)."""
        client = self.client
        return isinstance(client, ServerPool) and self.bridge.call(client.stranded())

    def pop_samples(self) -> list[dict[str, Any]]:
        """The episodes `monitor.log_samples` picked from the wave `take` returned last (once)."""
        rows, self._samples = self._samples, []
        return rows

    def pop_events(self) -> list[str]:
        """Warnings about the wave `take` returned last: failed verdicts, skipped rows (once)."""
        events, self._events = self._events, []
        return events

    def pause(self) -> None:
        """Before a weight push: no new groups, and aborted episodes hold until `resume`."""
        self.bridge.call(self.scheduler.close_gate())

    def resume(self, *, version: int) -> None:
        """After a weight push: the engines serve `version`; admit what the bound now allows."""
        self.bridge.call(self.scheduler.open_gate(version))

    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy answers to every held-out prompt, scored by the domain's reward; the first
        `monitor.log_samples` of each domain join samples.jsonl marked `"eval": true` (what the
        model answers greedily before and after training, not only its T = 1 samples)."""

        def keep(groups: list[Group]) -> None:
            rows = sample_rows(groups, per_domain=self.recipe.monitor.log_samples, step=step,
                               prompt_text=self.prompts.prompt_text)  # fmt: skip
            self._samples += [row | {"eval": True} for row in rows]

        return self.bridge.call(self.episodes.evaluate(self.evals, step=step, scored=keep))

    @property
    def client(self) -> RolloutClient:
        """The engines' client (the trainer side's HTTP client, or an in-process engine)."""
        return self.episodes.client

    @property
    def rewards(self) -> RewardPool:
        return self.episodes.rewards

    @rewards.setter
    def rewards(self, rewards: RewardPool) -> None:
        self.episodes.rewards = rewards

    @property
    def counts(self) -> dict[str, int]:
        """How many groups started, and how many ended each way (GROUP_ENDS)."""
        return self.ledger.counts

    @property
    def stop_reason(self) -> str | None:
        """Why the run should stop: set once a domain is past the failure budget."""
        return self.ledger.stop_reason

    # -- taking a wave ----------------------------------------------------------------------------
    async def _take(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        wave, waited = await self.scheduler.finished(step)
        fresh, stale = [], []
        for g in wave.kept:
            (fresh if all(step - c.oldest_version <= self.max_staleness for c in g.completions) else stale).append(g)
        self.ledger.end("stale", stale)
        self.ledger.end("trained", fresh)
        batch = self.shaping.build_batch(fresh)
        self._samples = wave.samples
        self._report(wave)
        metrics = {
            **wave.metrics,
            **{f"data/{domain}/dropped": float(len(rows)) for domain, rows in wave.dropped.items()},
            **staleness_metrics(fresh, step=step, max_staleness=self.max_staleness),
            **self.ledger.metrics(),
            "rollout/generation_idle_frac": self.idle.idle_frac(),  # since the last take
            "time/wait_rollout": waited,
            "batch/groups_kept": float(len(fresh)),
            "batch/sequences": float(len(batch)),
        }
        return batch, metrics

    def _report(self, wave: Wave) -> None:
        """The wave's failed verdicts and skipped rows as events; the failure budget's verdict."""
        step = wave.step + 1
        self._events += self.ledger.report(step, wave.failures)
        for key, reruns in sorted(wave.metrics.items()):
            if not (key.startswith("reward/") and key.endswith("/sandbox_reruns")):
                continue
            domain = key.split("/")[1]
            if reruns or wave.metrics.get(f"reward/{domain}/sandbox_restarts"):  # one line per death
                self._events.append(
                    f"reward {domain}: the sandbox's fork server had died and was restarted in step {step}; "
                    f"{reruns:g} run(s) it was running ran again"
                )
        limit = self.recipe.data.max_prompt_tokens
        for domain, rows in sorted(wave.dropped.items()):
            first, size = rows[0]
            self._events.append(
                f"data {domain}: {len(rows)} row(s) skipped in step {step}, prompt longer than data.max_prompt_tokens"
                f" = {limit} (first: id {first}, {size} tokens)"
            )

    # -- state --------------------------------------------------------------------------------------
    def state_dict(self, *, step: int) -> dict[str, Any]:
        """What resumes at `step`: the mixture as it was before wave `step` drew, with the refills of
        trained waves drawn after that (later waves are in flight or buffered and are dropped on
        resume, then drawn again: `WaveDraws`), and the reward stats."""
        return self.bridge.call(self._state(step))

    async def _state(self, step: int) -> dict[str, Any]:
        return {
            "mixture": self.draws.state_dict(step),
            "domain_stats": self.shaping.state_dict(),
            "counts": dict(self.ledger.counts),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.draws.load_state_dict(state["mixture"])
        self.shaping.load_state_dict(state["domain_stats"])
        # Groups in flight or buffered at the save are dropped on resume: they end as cancelled.
        self.ledger.load_counts(state.get("counts", {}))

    def close(self) -> None:
        """Cancel what is in flight or buffered (counted as cancelled), then stop the thread."""

        async def shutdown() -> None:
            await self.scheduler.cancel()
            self.ledger.cancel_live()
            close = getattr(self.client, "close", None)
            result = close() if close is not None else None
            if inspect.isawaitable(result):  # an HTTP client closes asynchronously, an in-process engine not
                await result

        try:
            self.bridge.call(shutdown())
        finally:
            self.bridge.stop()
            self.rewards.close()
            self.bridge.close()


def adaptive_shares(recipe: Recipe) -> AdaptiveShares | None:
    """`data.mix = "adaptive"`: shares that follow each domain's informative groups (data/adaptive.py)."""
    data = recipe.data
    if data.mix != "adaptive":
        return None
    probs = {name: p for name, p in data.domain_interleave_probs.items() if p > 0}
    return AdaptiveShares(probs, bounds=recipe.mix_bounds(), smoothing=data.mix_smoothing)


def difficulty_pools(recipe: Recipe) -> dict[str, DifficultyPool]:
    """The domains with a `pool` table: prompts that keep coming back alike rest (data/adaptive.py)."""
    return {
        name: DifficultyPool(retire_after=d.pool.retire_after, retire_failed_after=d.pool.failed_after,
                             revisit_after=d.pool.revisit_after, revisit_rate=d.pool.revisit_rate,
                             seed=hash_seed(recipe.experiment.seed, f"pool:{name}"))
        for name, d in recipe.domains.items()
        if d.pool is not None
    }  # fmt: skip
