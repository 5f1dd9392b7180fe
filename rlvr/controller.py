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
import dataclasses
import inspect
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.algorithms.advantages import RunningMoments
from rlvr.algorithms.filters import keep_group, soft_overlong_penalty
from rlvr.data.chat import encode_prompt, render_prompt
from rlvr.data.mixture import MixtureSampler, WaveDraws, hash_seed
from rlvr.evaluation import evaluate_groups
from rlvr.monitor.samples import sample_rows
from rlvr.recipe.schema import Recipe
from rlvr.rewards.budget import FailureBudget, StepFailures
from rlvr.rewards.pool import RewardPool
from rlvr.rollout.base import RolloutEngine, SamplingParams
from rlvr.rollout.episode import run_group
from rlvr.tools.session import Toolbox
from rlvr.types import GROUP_ENDS, Completion, Group, RolloutBatch, Sample


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
            if key.endswith(("/count", "/failed", "/timeouts", "/errors")):
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


@dataclass
class Wave:
    """One step's groups as they finish; `task` resolves when every round is done."""

    step: int
    prompts: list[Sample]
    kept: list[Group] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)  # monitor.log_samples episodes
    failures: dict[str, StepFailures] = field(default_factory=dict)  # per domain, every round
    dropped: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # (row id, prompt tokens)
    started_at: float = field(default_factory=time.perf_counter)
    task: asyncio.Task[None] | None = None


class RolloutManager:
    """Rank 0's rollout side (see the module docstring). Its state lives on its own event loop;
    the trainer thread reaches it only through `start`, `take`, `pause`, `resume`, `evaluate`,
    `state_dict` and `close`, which run there and wait for the answer."""

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
        self.max_staleness = recipe.rollout.max_staleness
        self.mixture = MixtureSampler(
            train,
            probs=recipe.data.domain_interleave_probs,
            prompts_per_step=recipe.data.prompts_per_step,
            seed=recipe.experiment.seed,
            shuffle=recipe.data.shuffle,
        )
        self.draws = WaveDraws(self.mixture, ahead=self.max_staleness)
        self.domain_stats = {name: RunningMoments() for name, d in recipe.domains.items() if d.reward_norm == "domain"}
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
        # Prompt token ids as an LRU sized to what is in flight: every round of the k + 1 waves
        # admitted, the wave being taken, and the largest eval domain (never every prompt ever drawn).
        rounds = recipe.data.prompts_per_step * (recipe.algorithm.max_refill_rounds + 1)
        self._prompt_capacity = rounds * (self.max_staleness + 2) + max(map(len, evals.values()), default=0)
        self._prompt_ids: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()
        self._prompt_lock = threading.Lock()  # the cache: the event loop and the tokenizing thread share it
        self._tokenizer_lock = threading.Lock()  # a HF fast tokenizer used by two threads at once can raise
        self.version = 0  # the weights the engines serve (trainer steps applied)
        self.counts: dict[str, int] = dict.fromkeys(("started", *GROUP_ENDS), 0)
        self._live: dict[int, Group] = {}  # groups started that have not ended, by id()
        self._waves: dict[int, Wave] = {}
        self._next_wave = 0
        self._refills_final: dict[int, asyncio.Event] = {}  # per wave: its refill draws are done
        self._active = 0  # episodes in flight
        self._idle_since: float | None = time.perf_counter()
        self._idle_s = 0.0
        self._window_start = time.perf_counter()
        self.loop = asyncio.new_event_loop()
        self._weights_ready = asyncio.Event()
        self._weights_ready.set()  # closed only while a weight push runs
        self._thread: threading.Thread | None = None
        self._samples: list[dict[str, Any]] = []  # the last taken wave's, for samples.jsonl
        self._events: list[str] = []  # warnings for events.jsonl, popped by the loop with the samples
        self.budget = FailureBudget(recipe.rewards.max_failed_frac, recipe.rewards.failure_window)
        self.stop_reason: str | None = None  # set once a domain is past the failure budget

    # -- the trainer's side (any thread) -------------------------------------------------------
    def start(self, *, version: int) -> None:
        """Start the manager's thread; waves from `version` on, as far as the bound allows."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.loop.run_forever, name="rlvr-rollout", daemon=True)
            self._thread.start()
        self._call(self._open_gate(version, first_wave=version))

    def take(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Block until wave `step` is complete; its batch and metrics (the trainer is at `step`)."""
        return self._call(self._take(step))

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
        self._call(self._close_gate())

    def resume(self, *, version: int) -> None:
        """After a weight push: the engines serve `version`; admit what the bound now allows."""
        self._call(self._open_gate(version))

    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy answers to every held-out prompt, scored by the domain's reward."""
        return self._call(self._evaluate(step))

    def _call(self, coro: Any) -> Any:
        if self._thread is None:  # not started: run inline (tests, eval-only use)
            return self.loop.run_until_complete(coro)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # -- prompts -> episodes -> groups -----------------------------------------------------------
    def prompt_ids(self, sample: Sample) -> list[int]:
        """The prompt's token ids: from the LRU when this step already asked (`_tokenize` fills it off
        the event loop before a round's episodes start), else tokenized here. Any thread."""
        # Keyed by the messages too: a train row and an eval row may share an id.
        key = (sample.domain, sample.id, tuple((m["role"], m["content"]) for m in sample.messages))
        with self._prompt_lock:
            ids = self._prompt_ids.get(key)
            if ids is not None:
                self._prompt_ids.move_to_end(key)
                return ids
        with self._tokenizer_lock:
            ids = encode_prompt(
                self._model_messages(sample), tokenizer=self.tokenizer, template=self.recipe.model.chat_template
            )
        with self._prompt_lock:
            self._prompt_ids[key] = ids
            while len(self._prompt_ids) > self._prompt_capacity:
                self._prompt_ids.popitem(last=False)
        return ids

    async def _tokenize(self, samples: Sequence[Sample]) -> None:
        """Tokenize a round's prompts on a worker thread: 128 chat templates and encodings (x k + 1
        waves) on the event loop would hold every episode, reward and weight-push call behind them."""
        await asyncio.to_thread(lambda: [self.prompt_ids(s) for s in samples])

    def prompt_text(self, sample: Sample) -> str:
        """The prompt as the model sees it (tool instructions included), as text."""
        return render_prompt(
            self._model_messages(sample), tokenizer=self.tokenizer, template=self.recipe.model.chat_template
        )

    def _model_messages(self, sample: Sample) -> list[dict[str, str]]:
        """The row's messages with its domain's tool instructions, if it has tools."""
        box = self.toolboxes.get(sample.domain)
        return box.prompt_messages(sample.messages) if box is not None else sample.messages

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

    def fits(
        self, samples: Sequence[Sample], *, dropped: dict[str, list[tuple[str, int]]] | None = None
    ) -> list[Sample]:
        """The samples whose prompt fits `data.max_prompt_tokens`; the others go into `dropped`."""
        limit, out = self.recipe.data.max_prompt_tokens, []
        for sample in samples:
            size = len(self.prompt_ids(sample))
            if size <= limit:
                out.append(sample)
            elif dropped is not None:
                dropped.setdefault(sample.domain, []).append((sample.id, size))
        return out

    async def _episodes(
        self, sample: Sample, *, n: int, seed: int | None, temperature: float | None = None
    ) -> list[Completion]:
        """n episodes of one prompt as one group (`run_group`: every request on one server, one
        n-sample request without tools); sample j is seeded `seed + j` (as SGLang-style
        n-sampling). `temperature` overrides the recipe's (evaluation)."""
        params = self.sampling(seed=seed)
        if temperature is not None:
            params = dataclasses.replace(params, temperature=temperature)
        box = self.toolboxes.get(sample.domain)
        for _ in range(n):
            self._episode_started()
        try:
            return await run_group(
                self.engine,
                prompt_ids=self.prompt_ids(sample),
                params=params,
                n=n,
                partial=self.recipe.rollout.partial,
                weights_ready=self._weights_ready.wait,
                tools=[box.session() for _ in range(n)] if box is not None else None,
                tokenizer=self.tokenizer,  # the text of a continued response: decoded from all its ids
            )
        finally:
            for _ in range(n):
                self._episode_ended()

    async def _group(self, sample: Sample, *, seed: int, scores: list[dict[str, float]]) -> Group:
        """Generate and score one group; scoring starts the moment its own n samples are done."""
        group = Group(sample=sample, completions=[])
        self._start(group)
        group.completions = await self._episodes(sample, n=self.recipe.rollout.n, seed=seed)
        scores.append(await self.rewards.score_groups([group]))
        return group

    def _start(self, group: Group) -> None:
        self.counts["started"] += 1
        self._live[id(group)] = group

    def _end(self, kind: str, groups: Sequence[Group]) -> None:
        """`groups` end as `kind` (one of GROUP_ENDS); each must have started and not ended yet."""
        for group in groups:
            if self._live.pop(id(group), None) is None:
                raise RuntimeError(f"a group of {group.sample.id} ended as {kind} but was not in flight")
        self.counts[kind] += len(groups)

    def _judged_only(self, group: Group, tallies: dict[str, StepFailures]) -> bool:
        """Take the samples that could not be judged out of `group` (in place), counting them;
        whether enough are left to train on: two to compare (one when the recipe samples one)."""
        tally = tallies.setdefault(group.sample.domain, StepFailures())
        for result in group.rewards:
            tally.add(failed=not result.judged, cause=result.failed)
        keep = [i for i, r in enumerate(group.rewards) if r.judged]
        if len(keep) < len(group.rewards):
            group.completions = [group.completions[i] for i in keep]
            group.rewards = [group.rewards[i] for i in keep]
        return len(keep) >= min(2, self.recipe.rollout.n)

    # -- waves ----------------------------------------------------------------------------------
    async def _open_gate(self, version: int, *, first_wave: int | None = None) -> None:
        self.version = version
        if first_wave is not None:
            self._next_wave = first_wave
        self._weights_ready.set()
        last = self.recipe.experiment.max_steps - 1
        while self._next_wave <= min(version + self.max_staleness, last):
            self._admit(self._next_wave)
            self._next_wave += 1

    async def _close_gate(self) -> None:
        self._weights_ready.clear()

    def _admit(self, step: int) -> None:
        wave = Wave(step=step, prompts=self.draws.quota(step))
        self._refills_final[step] = asyncio.Event()
        wave.task = self.loop.create_task(self._run_wave(wave))
        self._waves[step] = wave

    async def _run_wave(self, wave: Wave) -> None:
        try:
            await self._rounds(wave)
        finally:
            self.draws.finish(wave.step)
            event = self._refills_final.get(wave.step)
            if event is not None:
                event.set()

    async def _refill(self, step: int, domains: Sequence[str]) -> list[Sample]:
        """One prompt per entry of `domains` for wave `step`, once every earlier wave's refills are final."""
        for earlier in [event for s, event in self._refills_final.items() if s < step]:
            await earlier.wait()
        return [s for domain in domains for s in self.draws.refill(step, domain, 1)]

    async def _rounds(self, wave: Wave) -> None:
        """Rounds of groups for one step: the first from the quota, then dynamic sampling's refills."""
        algo, per_step = self.recipe.algorithm, self.recipe.data.prompts_per_step
        pending, kept = wave.prompts, wave.kept
        for round_ in range(algo.max_refill_rounds + 1):
            base = self.recipe.experiment.seed * 100_003 + wave.step * 16 + round_
            scores: list[dict[str, float]] = []
            await self._tokenize(pending)  # off the loop; `fits` and the episodes then read the cache
            groups = await asyncio.gather(
                *(
                    self._group(s, seed=hash_seed(base, f"{s.id}:{i}"), scores=scores)
                    for i, s in enumerate(self.fits(pending, dropped=wave.dropped))
                )
            )
            if round_ == 0:  # every episode, failed verdicts included: samples.jsonl says which
                wave.samples = sample_rows(
                    groups, per_domain=self.recipe.monitor.log_samples, step=wave.step + 1, prompt_text=self.prompt_text
                )
            judged, failed = [], []
            for g in groups:
                (judged if self._judged_only(g, wave.failures) else failed).append(g)
            self._end("failed", failed)
            if round_ == 0:
                wave.metrics.update(merge_reward_metrics(scores))
                wave.metrics.update(self._group_metrics(judged))
            survivors, dropped = [], []
            for g in judged:
                (survivors if keep_group(self.shaped_rewards(g), cfg=algo) else dropped).append(g)
            self._end("filtered", dropped)
            kept += survivors
            missing = per_step - len(kept)
            if not algo.dynamic_sampling or missing <= 0:
                break
            # Refill from the domains whose groups were dropped, in proportion (DAPO's dynamic sampling).
            kept_ids = {id(g) for g in survivors}
            lost = [g.sample.domain for g in groups if id(g) not in kept_ids][:missing]
            pending = await self._refill(wave.step, lost)
        if algo.dynamic_sampling and len(kept) > per_step:
            self._end("filtered", kept[per_step:])
            del kept[per_step:]
        wave.metrics["time/rollout"] = time.perf_counter() - wave.started_at

    async def _take(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        if step not in self._waves:  # not admitted yet (a caller without start/resume): admit it now
            await self._open_gate(max(self.version, step - self.max_staleness), first_wave=step)
        wave = self._waves.pop(step)
        start = time.perf_counter()
        assert wave.task is not None
        await wave.task
        waited = time.perf_counter() - start
        self.draws.forget(step)  # step's own mark stays: a stop before training it resumes it
        for old in [s for s in self._refills_final if s < step]:
            del self._refills_final[old]
        fresh, stale = [], []
        for g in wave.kept:
            (fresh if all(step - c.oldest_version <= self.max_staleness for c in g.completions) else stale).append(g)
        self._end("stale", stale)
        self._end("trained", fresh)
        batch = self.build_batch(fresh)
        self._samples = wave.samples
        self._report(wave)
        metrics = {
            **wave.metrics,
            **{f"data/{domain}/dropped": float(len(rows)) for domain, rows in wave.dropped.items()},
            **self._staleness_metrics(fresh, step=step),
            **self._count_metrics(),
            "time/wait_rollout": waited,
            "batch/groups_kept": float(len(fresh)),
            "batch/sequences": float(len(batch)),
        }
        return batch, metrics

    def _report(self, wave: Wave) -> None:
        """The wave's failed verdicts and skipped rows as events; the failure budget's verdict."""
        step = wave.step + 1
        for domain, tally in sorted(wave.failures.items()):
            if tally.failed:
                self._events.append(
                    f"reward {domain} could not judge {tally.failed} of {tally.total} samples in step {step} "
                    f"(not trained on): {tally.cause}"
                )
        limit = self.recipe.data.max_prompt_tokens
        for domain, rows in sorted(wave.dropped.items()):
            first, size = rows[0]
            self._events.append(
                f"data {domain}: {len(rows)} row(s) skipped in step {step}, prompt longer than data.max_prompt_tokens"
                f" = {limit} (first: id {first}, {size} tokens)"
            )
        self.stop_reason = self.stop_reason or self.budget.observe(step, wave.failures)

    # -- shaping ----------------------------------------------------------------------------------
    def shaped_rewards(self, group: Group) -> list[float]:
        """Scores plus DAPO's soft overlong penalty (the filters and advantages see these)."""
        algo, r = self.recipe.algorithm, self.recipe.rollout
        if not algo.overlong_buffer:
            return group.scores
        box = self.toolboxes.get(group.sample.domain)
        return [
            score
            + soft_overlong_penalty(
                len(c.token_ids),
                max_new_tokens=box.max_tokens if box is not None else r.max_new_tokens,
                buffer=algo.overlong_buffer,
                penalty=algo.overlong_penalty,
            )
            for score, c in zip(group.scores, group.completions, strict=True)
        ]

    def build_batch(self, groups: Sequence[Group]) -> RolloutBatch:
        """The trained groups in wave order; per-domain normalisation is updated here, in step order."""
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
        return batch.pack()  # flat arrays: what is broadcast and laid out, never rows of Python numbers

    # -- metrics ----------------------------------------------------------------------------------
    def _episode_started(self) -> None:
        if self._active == 0 and self._idle_since is not None:
            self._idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None
        self._active += 1

    def _episode_ended(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle_since = time.perf_counter()

    def _count_metrics(self) -> dict[str, float]:
        """Cumulative group counts, and the share of time since the last take with nothing generating."""
        now = time.perf_counter()
        idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
        window = max(now - self._window_start, 1e-9)
        self._idle_s, self._window_start = 0.0, now
        if self._idle_since is not None:
            self._idle_since = now
        return {
            **{f"groups/{k}": float(v) for k, v in self.counts.items()},
            "groups/in_flight": float(len(self._live)),
            "rollout/generation_idle_frac": min(idle / window, 1.0),
        }

    def _staleness_metrics(self, groups: Sequence[Group], *, step: int) -> dict[str, float]:
        lags = [step - c.oldest_version for g in groups for c in g.completions]
        if not lags:
            return {}
        out = {
            "rollout/staleness_max": float(max(lags)),
            "rollout/staleness_mean": sum(lags) / len(lags),
            "rollout/partial_frac": sum(len(set(c.token_versions)) > 1 for g in groups for c in g.completions)
            / len(lags),
        }
        for lag in range(self.max_staleness + 1):
            out[f"rollout/staleness_hist/{lag}"] = sum(x == lag for x in lags) / len(lags)
        return out

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
            if domain in self.toolboxes:
                out.update(self._tool_metrics(domain, [c for g in items for c in g.completions]))
        all_scores = [s for g in groups for s in g.scores]
        out["reward/mean"] = sum(all_scores) / max(len(all_scores), 1)
        return out

    @staticmethod
    def _tool_metrics(domain: str, completions: Sequence[Completion]) -> dict[str, float]:
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

    # -- evaluation ------------------------------------------------------------------------------
    async def _evaluate(self, step: int) -> dict[str, float]:
        """Each domain's held-out rows, `eval_n` samples at `eval_temperature` (0: greedy), scored by
        the domain's reward and reported per benchmark tag (`rlvr.evaluation`)."""
        base = self.recipe.experiment.seed * 100_003 + step

        async def generate(samples: list[Sample], n: int, temperature: float) -> list[Group]:
            fits = await asyncio.to_thread(self.fits, samples)  # tokenizes: off the event loop, as _tokenize
            completions = await asyncio.gather(
                *(
                    self._episodes(s, n=n, seed=hash_seed(base, f"eval:{s.id}:{i}"), temperature=temperature)
                    for i, s in enumerate(fits)
                )
            )
            return [Group(sample=s, completions=c) for s, c in zip(fits, completions, strict=True)]

        settings = {name: (d.eval_n, d.eval_temperature) for name, d in self.recipe.domains.items()}
        return await evaluate_groups(self.evals, generate=generate, rewards=self.rewards, settings=settings)

    # -- state --------------------------------------------------------------------------------------
    def state_dict(self, *, step: int) -> dict[str, Any]:
        """What resumes at `step`: the mixture as it was before wave `step` drew, with the refills of
        trained waves drawn after that (later waves are in flight or buffered and are dropped on
        resume, then drawn again: `WaveDraws`), and the reward stats."""
        return self._call(self._state(step))

    async def _state(self, step: int) -> dict[str, Any]:
        return {
            "mixture": self.draws.state_dict(step),
            "domain_stats": {k: v.state_dict() for k, v in self.domain_stats.items()},
            "counts": dict(self.counts),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.draws.load_state_dict(state["mixture"])
        for name, stats in self.domain_stats.items():
            stats.load_state_dict(state["domain_stats"][name])
        self.counts.update({k: int(v) for k, v in state.get("counts", {}).items() if k in self.counts})
        # Groups in flight or buffered at the save are dropped on resume: they end as cancelled.
        self.counts["cancelled"] += self.counts["started"] - sum(self.counts[k] for k in GROUP_ENDS)

    def close(self) -> None:
        """Cancel what is in flight or buffered (counted as cancelled), then stop the thread."""

        async def shutdown() -> None:
            for wave in self._waves.values():
                if wave.task is not None:
                    wave.task.cancel()
            await asyncio.gather(*(w.task for w in self._waves.values() if w.task is not None), return_exceptions=True)
            self._waves.clear()
            self._end("cancelled", list(self._live.values()))
            close = getattr(self.engine, "close", None)
            result = close() if close is not None else None
            if inspect.isawaitable(result):  # an HTTP client closes asynchronously, an in-process engine not
                await result

        try:
            self._call(shutdown())
        finally:
            if self._thread is not None:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(timeout=10)
            self.rewards.close()
            if not self.loop.is_running():
                self.loop.close()
