"""The rollout manager with a fake engine and fake rewards: batch shaping (dynamic sampling with
refill, overlong masking and shaping, per-domain normalisation), the staleness bound under random
delays and weight pushes, group conservation, k = 0 against the synchronous loop, and resume.

The asynchronous invariants are checked on what was generated, not on what `take` let through:
the fake engine tags every token with the version that sampled it (in `token_versions` and,
independently, in its logprob) and records every reply with the wave it served (`WAVE`, set by
`track`); `track` also keeps a ledger of every group the manager started and how each ended."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from rlvr.algorithms.filters import keep_group
from rlvr.collect.manager import RolloutManager
from rlvr.data.chat import encode_prompt
from rlvr.data.mixture import MixtureSampler, WaveDraws, hash_seed
from rlvr.recipe.schema import Recipe
from rlvr.types import GROUP_ENDS, Completion, Group, RewardResult, Sample


class CharTokenizer:
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 100 + 3 for c in text]}


# The wave (step) an episode works for, as the fake engine sees it: `track` sets it in each wave's task.
WAVE: contextvars.ContextVar[int | None] = contextvars.ContextVar("WAVE", default=None)


def sampled_by(logprob: float) -> int:
    """The version that sampled a fake engine's token, read from its logprob (see FakeEngine)."""
    return round(-1.0 - logprob)


class FakeEngine:
    """Sample j of a prompt (j = how many times that prompt was asked, mod n) has j+1 tokens; the last
    one runs to max_new_tokens (finish "length"). Tokens come out one per `delay` tick; `push()`
    aborts what is in flight with its tokens so far. Every token is tagged with the version that
    sampled it, twice: in `token_versions` and in its logprob (-1 - version), so a test can tell even
    if a tag is lost on the way. `replies` records every reply: (wave it served, version the request
    arrived at, its tokens' versions). Token values are derived from the seed so batches can be
    compared across schedules."""

    def __init__(self, n: int, *, delay: float = 0.0, jitter: float = 0.0, seed: int = 0) -> None:
        self.n, self.delay, self.jitter = n, delay, jitter
        self.rng = random.Random(seed)
        self.seen: Counter[tuple[int, ...]] = Counter()
        self.calls = 0
        self.version = 0
        self.paused = False
        self.in_flight: set[asyncio.Event] = set()
        self.replies: list[tuple[int | None, int, list[int]]] = []

    async def generate(self, requests: list[Any]) -> list[Completion]:
        """A group's n-sample request is its n samples side by side (sample j seeded seed + j)."""
        (request,) = requests
        n = getattr(request, "n", 1)
        if n > 1:
            seeded = [dataclasses.replace(request, n=1, params=dataclasses.replace(
                request.params, seed=None if request.params.seed is None else request.params.seed + j))
                for j in range(n)]  # fmt: skip
            return [c for part in await asyncio.gather(*(self.generate([sub]) for sub in seeded)) for c in part]
        self.calls += 1
        assert not self.paused, "a request reached a paused engine"
        arrived = self.version
        prompt = tuple(request.input_ids)
        j = self.seen[prompt] % self.n
        self.seen[prompt] += 1
        budget = request.params.max_new_tokens
        length = budget if j == self.n - 1 else min(j + 1, budget)
        abort = asyncio.Event()
        self.in_flight.add(abort)
        tokens: list[int] = []
        versions: list[int] = []
        seed = request.params.seed or 0
        finish = "length" if length == budget else "stop"
        try:
            for i in range(length):
                if self.delay or self.jitter:
                    await asyncio.sleep(self.delay + self.rng.random() * self.jitter)
                if abort.is_set():
                    finish = "abort"
                    break
                tokens.append(3 + (seed + i) % 50)
                versions.append(self.version)
        finally:
            self.in_flight.discard(abort)
        self.replies.append((WAVE.get(), arrived, versions))
        return [self._completion(request, j, tokens, versions, finish)]

    def _completion(self, request: Any, j: int, tokens: list[int], versions: list[int], finish: str) -> Completion:
        return Completion(text=str(j), token_ids=tokens, logprobs=[-1.0 - v for v in versions], finish_reason=finish,
                          prompt_token_ids=list(request.input_ids), policy_version=self.version,
                          token_versions=versions)  # fmt: skip

    def push(self, version: int) -> None:
        """What a weight sync does to the engine: abort in-flight requests, load, continue."""
        for event in self.in_flight:
            event.set()
        self.version = version


class FakeRewards:
    """Domain "flat": every completion scores 1 (zero variance). Domain "mixed": completion j scores j."""

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        for group in groups:
            flat = group.sample.domain == "flat"
            group.rewards = [RewardResult(1.0 if flat else float(c.text)) for c in group.completions]
        return {"reward/fake/count": 3.0, "reward/fake/mean": 1.0}

    def close(self) -> None:
        pass


def samples(domain: str, count: int) -> list[Sample]:
    return [
        Sample(id=f"{domain}{i}", tag=domain, domain=domain, messages=[{"role": "user", "content": f"q{i}"}])
        for i in range(count)
    ]


def recipe(*, k: int = 0, steps: int = 6, max_failed_frac: float = 0.25, **algorithm: Any) -> Recipe:
    return Recipe.model_validate({
        "experiment": {"max_steps": steps},
        "model": {"config": {}},
        "data": {"prompts_per_step": 4, "domain_interleave_probs": {"flat": 0.5, "mixed": 0.5}},
        "domains": {
            "flat": {"tags": ["flat"], "files": ["x"], "reward": "math_rule"},
            "mixed": {"tags": ["mixed"], "files": ["x"], "reward": "math_rule", "reward_norm": "domain"},
        },
        "rollout": {"n": 3, "max_new_tokens": 10, "max_staleness": k},
        "algorithm": {"preset": "grpo", "tis_cap": 2.0, **algorithm},
        "rewards": {"max_failed_frac": max_failed_frac},
    })  # fmt: skip


def make(engine: FakeEngine | None = None, *, rewards: Any = None, **kw: Any) -> tuple[RolloutManager, FakeEngine]:
    engine = engine or FakeEngine(3)
    manager = RolloutManager(
        recipe(**kw),
        train={"flat": samples("flat", 5), "mixed": samples("mixed", 5)},
        evals={},
        tokenizer=CharTokenizer(),
        client=engine,  # type: ignore[arg-type]
        rewards=rewards or FakeRewards(),  # type: ignore[arg-type]
    )
    return manager, engine


def drive(
    manager: RolloutManager, engine: FakeEngine, *, steps: range, train_s: float = 0.0, seed: int = 0,
    after_take: Callable[[int], None] | None = None,
) -> list[tuple[Any, dict[str, float]]]:  # fmt: skip
    """The loop's protocol with the manager: take, (train: up to `train_s` seconds), pause, push, resume."""
    out = []
    rng = random.Random(seed)
    manager.start(version=steps.start)
    for step in steps:
        out.append(manager.take(step))
        if after_take is not None:
            after_take(step)
        if train_s:
            time.sleep(rng.random() * train_s)
        manager.pause()
        manager.loop.call_soon_threadsafe(engine.push, step + 1)
        manager.resume(version=step + 1)
    return out


@dataclass
class Tracked:
    """What `track` saw: each wave's admission version, and every group the manager started (in
    order) with its wave and every way it ended."""

    admitted: dict[int, int] = field(default_factory=dict)
    groups: list[Group] = field(default_factory=list)
    wave: list[int] = field(default_factory=list)
    ends: list[list[str]] = field(default_factory=list)
    serial: dict[int, int] = field(default_factory=dict)  # id(group) -> index (groups stay referenced)


def track(manager: RolloutManager) -> Tracked:
    """Wrap the manager's wave admission and its ledger's group start/end (instance attributes, no
    subclass): every wave's task runs with WAVE set to its step, so the engine and the ledger know
    whom they serve."""
    seen = Tracked()
    scheduler, ledger = manager.scheduler, manager.ledger
    admit, run_wave, start, end = scheduler.admit, scheduler.run_wave, ledger.start, ledger.end

    def _admit(step: int) -> None:
        seen.admitted[step] = scheduler.version
        admit(step)

    async def _run_wave(wave: Any) -> None:
        WAVE.set(wave.step)
        await run_wave(wave)

    def _start(group: Group) -> None:
        seen.serial[id(group)] = len(seen.groups)
        seen.groups.append(group)
        wave = WAVE.get()
        assert wave is not None
        seen.wave.append(wave)
        seen.ends.append([])
        start(group)

    def _end(kind: str, groups: Any) -> None:
        for group in groups:
            seen.ends[seen.serial[id(group)]].append(kind)
        end(kind, groups)

    scheduler.admit, scheduler.run_wave = _admit, _run_wave  # type: ignore[method-assign]
    ledger.start, ledger.end = _start, _end  # type: ignore[method-assign]
    return seen


# -- batch shaping (the synchronous behaviour, k = 0) ------------------------------------------------
def test_plain_grpo_keeps_every_group_and_masks_nothing() -> None:
    manager, engine = make()
    batch, metrics = manager.take(0)
    assert len(batch) == 4 * 3 and engine.calls == 12  # one request per episode
    assert set(batch.domains) == {"flat", "mixed"}
    assert batch.loss_masks == [1.0] * 12
    assert metrics["groups/filtered"] == 0 and metrics["groups/trained"] == 4
    rendered = [CharTokenizer()(f"user: q{i}\nassistant: ")["input_ids"] for i in range(5)]
    assert all(p in rendered for p in batch.prompts)  # the chat-rendered prompt, token for token
    manager.close()


def test_dynamic_sampling_drops_flat_groups_and_refills_from_their_domain() -> None:
    manager, engine = make(dynamic_sampling=True, max_refill_rounds=2)
    batch, metrics = manager.take(0)
    # flat groups never survive; each round refills from "flat" again, so only the 2 mixed groups remain
    assert engine.calls == (4 + 2 + 2) * 3
    assert set(batch.domains) == {"mixed"} and len(batch) == 2 * 3
    assert metrics["groups/filtered"] == 6 and metrics["groups/started"] == 8
    manager.close()


def test_overlong_mask_and_soft_penalty() -> None:
    manager, _ = make(overlong_mask=True, overlong_buffer=4, overlong_penalty=1.0)
    batch, _ = manager.take(0)
    flat = [i for i, d in enumerate(batch.domains) if d == "flat"]
    # completion 2 of each group is 10 tokens = max_new_tokens: loss-masked and penalised by the full 1.0
    assert [batch.loss_masks[i] for i in flat[:3]] == [1.0, 1.0, 0.0]
    assert [batch.rewards[i] for i in flat[:3]] == [1.0, 1.0, 0.0]
    manager.close()


def test_domain_normalisation_uses_running_stats_and_resumes() -> None:
    manager, _ = make()
    batch, _ = manager.take(0)
    mixed = [batch.rewards[i] for i, d in enumerate(batch.domains) if d == "mixed"]
    assert abs(sum(mixed)) < 1e-6  # raw 0, 1, 2 per group, normalised by the domain's running mean/std
    state = manager.state_dict(step=1)
    again, _ = make()
    again.load_state_dict(state)
    assert [s.id for s in again.mixture.next_batch()] == [s.id for s in manager.mixture.next_batch()]
    assert again.shaping.domain_stats["mixed"].state_dict() == manager.shaping.domain_stats["mixed"].state_dict()
    manager.close()
    again.close()


# -- the synchronous reference: today's loop, written out ---------------------------------------------
def sequential_batches(manager: RolloutManager, steps: int) -> list[list[tuple]]:
    """Generate every group of a step, then score, then filter and refill, then build: the loop rlvr
    ran before the manager went asynchronous, with the same seeds (sample j of a group: seed + j)."""
    rec = manager.recipe
    engine = FakeEngine(rec.rollout.n)
    rewards = FakeRewards()
    mixture = MixtureSampler({name: s.samples for name, s in manager.mixture.streams.items()},
                             probs=rec.data.domain_interleave_probs, prompts_per_step=rec.data.prompts_per_step,
                             seed=rec.experiment.seed)  # fmt: skip
    out = []
    for step in range(steps):
        pending, kept = mixture.next_batch(), []
        for round_ in range((rec.algorithm.max_refill_rounds or 0) + 1):
            groups = []
            for i, s in enumerate(pending):
                seed = hash_seed(rec.experiment.seed * 100_003 + step * 16 + round_, f"{s.id}:{i}")
                prompt = encode_prompt(s.messages, tokenizer=CharTokenizer(), template="auto")
                completions = []
                for j in range(rec.rollout.n):
                    request = type("R", (), {})()
                    request.input_ids = prompt
                    request.params = manager.episodes.sampling(seed=seed + j)
                    completions += asyncio.run(engine.generate([request]))
                groups.append(Group(sample=s, completions=completions))
            asyncio.run(rewards.score_groups(groups))
            survivors = [g for g in groups if keep_group(g.scores, cfg=rec.algorithm)]
            kept += survivors
            missing = rec.data.prompts_per_step - len(kept)
            if not rec.algorithm.dynamic_sampling or missing <= 0:
                break
            lost = [g.sample.domain for g in groups if g not in survivors][:missing]
            pending = [s for d in lost for s in mixture.take(d, 1)]
        kept = kept[: rec.data.prompts_per_step]
        out.append([(g.sample.id, [c.token_ids for c in g.completions], g.scores) for g in kept])
    return out


def manager_batches(results: list[tuple[Any, dict[str, float]]]) -> list[list[tuple]]:
    return [[batch.responses[i : i + 3] for i in range(0, len(batch), 3)] for batch, _ in results]


@pytest.mark.parametrize("algorithm", [{}, {"dynamic_sampling": True, "max_refill_rounds": 2}])
def test_k0_reproduces_the_synchronous_loop_under_random_delays(algorithm) -> None:
    manager, engine = make(FakeEngine(3, delay=0.0005, jitter=0.002, seed=1), k=0, **algorithm)
    reference = sequential_batches(manager, 4)
    got = drive(manager, engine, steps=range(4))
    manager.close()
    assert [[tokens for _, tokens, _ in step] for step in reference] == manager_batches(got)
    # k = 0: every token was sampled by exactly the trainer's weights
    assert all(m["rollout/staleness_max"] == 0 for _, m in got if "rollout/staleness_max" in m)


# -- asynchronous: the bound, conservation, resume ------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("partial", [True, False])
def test_staleness_bound_and_conservation_under_random_delays(k, partial) -> None:
    engine = FakeEngine(3, delay=0.001, jitter=0.004, seed=k)
    manager, _ = make(engine, k=k, steps=8, dynamic_sampling=True, max_refill_rounds=1)
    manager.recipe.rollout.partial = partial
    results = drive(manager, engine, steps=range(5))
    for step, (batch, metrics) in enumerate(results):
        assert all(step - v <= k for v in batch.versions), (step, batch.versions)
        assert metrics["rollout/staleness_max"] <= k
    assert any(m["rollout/staleness_max"] > 0 for _, m in results[1:]), "generation never overlapped training"
    state = manager.state_dict(step=5)
    manager.close()
    counts = manager.counts
    assert counts["started"] == sum(counts[e] for e in GROUP_ENDS)
    assert counts["cancelled"] > 0  # waves 5..5+k were in flight or buffered at close

    # Resume at step 5 on fresh engines serving version 5: the bound holds right away.
    engine2 = FakeEngine(3, delay=0.001, jitter=0.004, seed=7)
    engine2.version = 5
    again, _ = make(engine2, k=k, steps=8)
    again.load_state_dict(state)
    resumed = drive(again, engine2, steps=range(5, 8))
    again.close()
    for step, (batch, _) in zip(range(5, 8), resumed, strict=True):
        assert all(step - k <= v <= step for v in batch.versions)
    counts = again.counts
    assert counts["started"] == sum(counts[e] for e in GROUP_ENDS)


def test_resume_redraws_exactly_what_the_interrupted_waves_would_have() -> None:
    """k = 0 with dynamic-sampling refills: a run stopped at step 2 and resumed trains the same prompts."""
    full, engine = make(k=0, steps=4, dynamic_sampling=True, max_refill_rounds=2)
    straight = drive(full, engine, steps=range(4))
    full.close()
    first, engine = make(k=0, steps=4, dynamic_sampling=True, max_refill_rounds=2)
    drive(first, engine, steps=range(2))
    state = first.state_dict(step=2)
    first.close()
    second, engine = make(k=0, steps=4, dynamic_sampling=True, max_refill_rounds=2)
    engine.version = 2  # the worker pushes the checkpoint's weights to fresh engines before the loop
    second.load_state_dict(state)
    resumed = drive(second, engine, steps=range(2, 4))
    second.close()
    assert [b.prompts for b, _ in resumed] == [b.prompts for b, _ in straight[2:]]


def test_stale_groups_are_dropped_and_counted() -> None:
    """An engine that reports older weights than it should (one that came back stale) never trains."""
    manager, engine = make(k=0)
    engine.version = 1  # the engine claims version 1 while the trainer is at 3
    manager.start(version=3)
    batch, metrics = manager.take(3)
    manager.close()
    assert len(batch) == 0 and metrics["groups/stale"] == 4


# -- verdicts: a sample the reward could not judge never trains ------------------------------------------
class FailingRewards(FakeRewards):
    """As FakeRewards, but completion j of domain `domain` could not be judged when j is in `fail`."""

    def __init__(self, *, fail: set[int], domain: str = "mixed") -> None:
        self.fail, self.domain = fail, domain

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        await super().score_groups(groups)
        for group in groups:
            if group.sample.domain == self.domain:
                for j, c in enumerate(group.completions):
                    if int(c.text) in self.fail:
                        group.rewards[j] = RewardResult(0.0, {"reason": "x"}, failed="RuntimeError: backend down")
        return {}


def make_failing(fail: set[int], **kw: Any) -> RolloutManager:
    r = recipe(**kw)
    r.domains["mixed"].reward_norm = "none"  # raw scores, so the advantages can be worked out by hand
    return RolloutManager(r, train={"flat": samples("flat", 5), "mixed": samples("mixed", 5)}, evals={},
                          tokenizer=CharTokenizer(), client=FakeEngine(3),  # type: ignore[arg-type]
                          rewards=FailingRewards(fail=fail))  # type: ignore[arg-type]  # fmt: skip


def test_a_failed_sample_leaves_its_group_and_the_rest_keep_their_own_baseline() -> None:
    import torch

    from rlvr.algorithms.advantages import normalize_rewards_per_group

    manager = make_failing({1})  # mixed: samples score 0, (failed), 2
    batch, metrics = manager.take(0)
    manager.close()
    mixed = [i for i, d in enumerate(batch.domains) if d == "mixed"]
    flat = [i for i, d in enumerate(batch.domains) if d == "flat"]
    assert len(mixed) == 2 * 2 and len(flat) == 2 * 3  # two mixed groups of 3, one failed sample each
    assert [batch.rewards[i] for i in mixed] == [0.0, 2.0, 0.0, 2.0]
    assert [len(batch.responses[i]) for i in mixed] == [1, 10, 1, 10]  # samples j = 0 and 2, not j = 1 (2 tokens)
    # GRPO's advantage of the judged pair (0, 2): mean 1, unbiased std sqrt(2) -> -1/sqrt(2), +1/sqrt(2);
    # with the failed sample trained as a 0 it would have been (0, 0, 2): -0.577, -0.577, +1.155.
    adv = normalize_rewards_per_group(torch.tensor(batch.rewards), torch.tensor(batch.group_ids))
    expected = [-(2**-0.5), 2**-0.5] * 2
    assert [round(float(adv[i]), 4) for i in mixed] == [round(x, 4) for x in expected]
    assert metrics["groups/trained"] == 4 and metrics["groups/failed"] == 0
    assert manager.pop_events() == ["reward mixed could not judge 2 of 6 samples in step 1 (not trained on): "
                                    "RuntimeError: backend down"]  # fmt: skip
    assert manager.stop_reason == "reward mixed could not judge 2 of 6 samples in step 1: RuntimeError: backend down"


def test_a_group_left_with_one_judged_sample_is_dropped_and_counted() -> None:
    manager = make_failing({0, 1}, max_failed_frac=1.0)
    batch, metrics = manager.take(0)
    manager.close()
    assert set(batch.domains) == {"flat"} and len(batch) == 2 * 3
    assert metrics["groups/failed"] == 2 and metrics["groups/trained"] == 2
    assert manager.counts["started"] == sum(manager.counts[e] for e in GROUP_ENDS)
    assert manager.stop_reason is None  # max_failed_frac = 1: never stops


def test_the_failure_budget_counts_a_window_of_steps() -> None:
    from rlvr.rewards.budget import FailureBudget, StepFailures

    budget = FailureBudget(0.25, 3)
    ok, bad = (
        StepFailures(total=40),
        StepFailures(total=40, failed=12, cause="RuntimeError: reward backend unavailable"),
    )
    assert budget.observe(1, {"math": ok}) is None
    assert budget.observe(2, {"math": ok}) is None
    assert budget.observe(3, {"math": StepFailures(total=40, failed=20, cause="x")}) is None  # 20 of 120
    assert budget.observe(4, {"math": bad, "code": ok}) == (
        "reward math could not judge 32 of 120 samples in steps 2-4: x"
    )  # the first cause in the window
    assert FailureBudget(0.25, 3).observe(1, {"math": bad}) == (
        "reward math could not judge 12 of 40 samples in step 1: RuntimeError: reward backend unavailable"
    )


def test_rows_longer_than_the_prompt_limit_are_counted_and_said() -> None:
    manager, _ = make()
    short = [
        Sample(id=f"s{i}", tag="flat", domain="flat", messages=[{"role": "user", "content": ""}]) for i in range(5)
    ]
    manager.mixture.streams["flat"].samples[:] = short
    manager.recipe.data.max_prompt_tokens = len(
        manager.prompts.prompt_ids(short[0])
    )  # the "mixed" rows say "qN": longer
    batch, metrics = manager.take(0)
    manager.close()
    assert (
        set(batch.domains) == {"flat"} and metrics["data/mixed/dropped"] == 2.0 and "data/flat/dropped" not in metrics
    )
    assert manager.pop_events() == [
        "data mixed: 2 row(s) skipped in step 1, prompt longer than data.max_prompt_tokens = 18 (first: id mixed0, "
        "20 tokens)"
    ]


# -- the asynchronous invariants, checked on what was generated ------------------------------------------
class ByIdRewards(FakeRewards):
    """Verdicts that follow from the prompt alone, whatever the timing: every "flat" group, and the
    "mixed" groups of even-numbered rows, score all 1 (dropped by dynamic sampling, refilled); the
    other "mixed" groups score 0, 1, 2 by sample."""

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        for group in groups:
            flat = group.sample.domain == "flat" or int(group.sample.id.removeprefix("mixed")) % 2 == 0
            group.rewards = [RewardResult(1.0 if flat else float(j)) for j in range(len(group.completions))]
        return {}


def drawn(seen: Tracked, waves: range) -> dict[int, list[str]]:
    """The prompts each wave started a group for, quota then refills, in the order they started."""
    return {w: [g.sample.id for g, gw in zip(seen.groups, seen.wave, strict=True) if gw == w] for w in waves}


def trained(results: list[tuple[Any, dict[str, float]]]) -> list[list[tuple[str, tuple[int, ...]]]]:
    return [[(b.domains[i], tuple(b.prompts[i])) for i in range(0, len(b), 3)] for b, _ in results]


@pytest.mark.parametrize("k", [1, 2])
def test_k_ahead_draws_the_same_prompts_whatever_the_timing_and_across_a_resume(k) -> None:
    """Dynamic sampling refills while later waves are already admitted: two straight runs with other
    random delays, and a run stopped at step 3 and resumed on fresh engines, draw (and train) the
    same prompts for every step."""

    def run(steps: range, seed: int, state: Any = None) -> tuple[Tracked, list[Any], Any]:
        engine = FakeEngine(3, delay=0.0005, jitter=0.003, seed=seed)
        engine.version = steps.start  # the worker pushes the checkpoint's weights before the loop
        manager, _ = make(engine, rewards=ByIdRewards(), k=k, steps=7, dynamic_sampling=True, max_refill_rounds=2)
        if state is not None:
            manager.load_state_dict(state)
        seen = track(manager)
        results = drive(manager, engine, steps=steps, train_s=0.01, seed=seed)
        state = manager.state_dict(step=steps.stop)
        manager.close()
        return seen, results, state

    straight, results, _ = run(range(7), seed=1)
    other, other_results, _ = run(range(7), seed=2)
    first, first_results, state = run(range(3), seed=3)
    resumed, resumed_results, _ = run(range(3, 7), seed=4, state=state)

    # The hazard was there: a wave drew refills after a later wave had drawn its quota.
    assert any(a > b for i, a in enumerate(straight.wave) for b in straight.wave[i + 1 :]), "no wave overlapped"
    assert any(len(ids) > 4 for ids in drawn(straight, range(7)).values()), "no refills"
    assert drawn(other, range(7)) == drawn(straight, range(7))
    assert drawn(first, range(3)) == drawn(straight, range(3))
    assert drawn(resumed, range(3, 7)) == drawn(straight, range(3, 7))
    assert trained(other_results) == trained(results) == trained(first_results + resumed_results)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("partial", [True, False])
def test_every_token_is_sampled_by_weights_the_bound_allows_not_only_those_take_returns(k, partial) -> None:
    """The bound on what was generated: each wave's admission version, and every reply the engine
    sent for it (aborted, dropped, filtered or trained); a trained token's version, end to end.
    Whether a push lands inside a sample that then trains is timing: with `partial`, up to three
    runs (other seeds) must show one; without, none may ever."""
    spanned = False
    for attempt in range(3 if partial else 1):
        spanned = max(_bounded_run(k, partial, seed=k + 10 * attempt)) > 1
        if spanned:
            break
    assert spanned == partial  # a trained rollout spanned a push exactly when partial


def _bounded_run(k: int, partial: bool, *, seed: int) -> list[int]:
    """One run of the test above, every bound asserted; each trained rollout's count of versions."""
    engine = FakeEngine(3, delay=0.001, jitter=0.004, seed=seed)
    manager, _ = make(engine, k=k, steps=12, dynamic_sampling=True, max_refill_rounds=1)
    manager.recipe.rollout.partial = partial
    seen = track(manager)
    results = drive(manager, engine, steps=range(10), train_s=0.004, seed=seed)
    manager.close()
    # The gate: wave s is admitted the moment the engines serve s - k (the run starts at 0), not before.
    assert seen.admitted == {s: max(s - k, 0) for s in seen.admitted}, seen.admitted
    assert engine.replies
    for wave, arrived, versions in engine.replies:
        assert wave is not None and wave - k <= arrived <= wave and all(wave - k <= v <= wave for v in versions)
    assert any(v < (wave or 0) for wave, _, versions in engine.replies for v in versions), "no generation overlapped"
    assert manager.counts["stale"] == 0  # an honest engine: nothing for `take` to catch
    spans = []
    for step, (batch, metrics) in enumerate(results):
        truth = [[sampled_by(x) for x in lp] for lp in batch.rollout_logprobs]  # the engine's own tags
        assert batch.versions == [min(t) for t in truth]  # partial tokens keep their version, end to end
        assert metrics["rollout/staleness_max"] == max(step - min(t) for t in truth) <= k
        spans += [len(set(t)) for t in truth]
    return spans


class LaggingEngine(FakeEngine):
    """As FakeEngine, but the first request of an episode of one of `prompts` (the bare prompt) comes
    back aborted after one token sampled by weights `lag` versions old (an engine that served old
    weights, then caught up): the episode continues it as a partial rollout whose first token is the
    oldest and whose last ones are fresh."""

    def __init__(self, n: int, *, lag: int, prompts: set[tuple[int, ...]], **kw: Any) -> None:
        super().__init__(n, **kw)
        self.lag, self.prompts = lag, prompts

    async def generate(self, requests: list[Any]) -> list[Completion]:
        (request,) = requests
        if request.n > 1 or tuple(request.input_ids) not in self.prompts:  # n > 1: split, then back here
            return await super().generate(requests)
        version = self.version - self.lag
        self.replies.append((WAVE.get(), self.version, [version]))
        return [self._completion(request, 0, [3], [version], "abort")]


def test_a_partial_rollout_whose_first_tokens_predate_the_bound_is_dropped() -> None:
    """k = 1 at step 3: a rollout begun by version 1 is stale though its last tokens are version 3's;
    one begun by version 2 (= s - k) trains."""
    manager, _ = make(k=1)
    prompts = {tuple(manager.prompts.prompt_ids(s)) for s in samples("mixed", 5)}  # "q0".."q4": every row
    manager.close()
    for lag, dropped in [(1, False), (2, True)]:
        engine = LaggingEngine(3, lag=lag, prompts=prompts)
        engine.version = 3
        manager, _ = make(engine, k=1)
        seen = track(manager)
        manager.start(version=3)
        batch, metrics = manager.take(3)
        manager.close()
        completions = [c for g, w in zip(seen.groups, seen.wave, strict=True) if w == 3 for c in g.completions]
        assert len(completions) == 4 * 3
        for c in completions:  # the partial rollout: first token old, the rest fresh, a fresh last reply
            assert c.token_versions == [3 - lag] + [3] * (len(c.token_ids) - 1) and len(c.token_ids) > 1
            assert c.policy_version == 3 and c.finish_reason != "abort"
        if dropped:
            assert len(batch) == 0 and metrics["groups/stale"] == 4 and metrics["groups/trained"] == 0
        else:
            assert len(batch) == 12 and metrics["groups/stale"] == 0
            assert metrics["rollout/staleness_max"] == 1 and metrics["rollout/partial_frac"] == 1.0


class LedgerRewards(FakeRewards):
    """flat: all 1 (filtered); mixed3: two of three samples cannot be judged (failed); other mixed
    rows: 0, 1, 2 by sample (trained, or stale when the engine lags on them)."""

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        for group in groups:
            flat = group.sample.domain == "flat"
            group.rewards = [RewardResult(1.0 if flat else float(j)) for j in range(len(group.completions))]
            if group.sample.id == "mixed3":
                group.rewards[:2] = [RewardResult(0.0, failed="RuntimeError: judge down")] * 2
        return {}


@pytest.mark.parametrize("k", [1, 2])
def test_every_started_group_ends_exactly_once_and_by_its_wave_s_take(k) -> None:
    """A per-group ledger, not `started == sum(ends)` (which `close()` makes an identity): every group
    of wave s has one end when take(s) returns, and only groups of waves not taken end cancelled."""
    manager, _ = make(k=k)
    lagging = {tuple(manager.prompts.prompt_ids(s)) for s in samples("mixed", 5) if s.id == "mixed4"}  # "q4"
    manager.close()
    engine = LaggingEngine(3, lag=k + 1, prompts=lagging, delay=0.001, jitter=0.003, seed=k)
    manager, _ = make(engine, rewards=LedgerRewards(), k=k, steps=8, dynamic_sampling=True, max_refill_rounds=1,
                      max_failed_frac=1.0)  # fmt: skip
    seen = track(manager)

    def check(step: int) -> None:
        for wave, ends in zip(seen.wave, seen.ends, strict=True):
            assert len(ends) <= 1, (wave, ends)
            if wave <= step:
                assert len(ends) == 1 and ends[0] != "cancelled", (wave, ends)

    drive(manager, engine, steps=range(5), train_s=0.004, seed=k, after_take=check)
    manager.close()
    assert all(len(ends) == 1 for ends in seen.ends), seen.ends
    assert {wave for wave, ends in zip(seen.wave, seen.ends, strict=True) if ends == ["cancelled"]} <= set(range(5, 8))
    tally = Counter(ends[0] for ends in seen.ends)
    assert set(tally) == set(GROUP_ENDS)  # every way a group can end happened
    assert {kind: manager.counts[kind] for kind in GROUP_ENDS} == dict(tally)
    assert manager.counts["started"] == len(seen.groups)


def simulate_draws(k: int, *, steps: int, seed: int, start: int = 0, state: Any = None) -> tuple[dict, dict, dict]:
    """WaveDraws under one random schedule the manager allows: wave w is admitted once wave w - k - 1
    was taken, refills go to the oldest wave still refilling (the others wait, as in `_refill`), and
    a wave is taken once its refills are final. Wave w's refill rounds ask for a fixed list of
    domains. Returns each wave's quota and refills (ids, in order) and `state_dict(s)` as the loop
    saves it after taking wave s - 1."""
    mixture = MixtureSampler({"flat": samples("flat", 5), "mixed": samples("mixed", 7)},
                             probs={"flat": 0.5, "mixed": 0.5}, prompts_per_step=3, seed=0)  # fmt: skip
    draws = WaveDraws(mixture, ahead=k)
    if state is not None:
        draws.load_state_dict(state)
    rng = random.Random(seed)
    quotas: dict[int, list[str]] = {}
    refills: dict[int, list[str]] = {}
    rounds: dict[int, list[list[str]]] = {}
    states: dict[int, Any] = {}
    admitted = taken = start
    while taken < steps:
        actions = ["admit"] if admitted < steps and admitted <= taken + k else []
        refilling = [w for w in range(taken, admitted) if rounds[w]]
        if refilling:
            actions.append("refill")
        if taken < admitted and not rounds[taken]:
            actions.append("take")
        action = rng.choice(actions)
        if action == "admit":
            w = admitted
            quotas[w] = [s.id for s in draws.quota(w)]
            rounds[w] = [[("flat", "mixed")[(w + r + i) % 2] for i in range((w * 5 + r) % 4)] for r in range(2)]
            refills[w] = []
            admitted += 1
        elif action == "refill":
            w = refilling[0]
            refills[w] += [s.id for d in rounds[w].pop(0) for s in draws.refill(w, d, 1)]
        else:
            draws.finish(taken)  # its rounds are done
            draws.forget(taken)
            taken += 1
            states[taken] = draws.state_dict(taken)
        for w in range(taken, admitted):
            if not rounds[w]:
                draws.finish(w)
    return quotas, refills, states


@pytest.mark.parametrize("k", [0, 1, 2])
def test_wave_draws_follow_the_step_not_the_schedule_and_resume_from_any_step(k) -> None:
    from rlvr.data.mixture import DomainStream, QuotaSchedule

    quotas, refills, states = simulate_draws(k, steps=9, seed=0)
    for seed in range(1, 6):  # other schedules, same draws
        assert simulate_draws(k, steps=9, seed=seed)[:2] == (quotas, refills)
    for s in range(1, 9):  # stopped after step s - 1, resumed under yet another schedule
        q, r, _ = simulate_draws(k, steps=9, seed=10 + s, start=s, state=states[s])
        assert (q, r) == ({w: quotas[w] for w in q}, {w: refills[w] for w in r}) and set(q) == set(range(s, 9))
    # The mixture's guarantees: quotas by the schedule; each domain's draws, in the documented order
    # Q(0)..Q(k), R(0), Q(k+1), R(1), ..., walk its stream (each row once per epoch). k = 0: the loop's.
    schedule = QuotaSchedule({"flat": 0.5, "mixed": 0.5}, prompts_per_step=3)
    assert [Counter(i.rstrip("0123456789") for i in quotas[w]) for w in range(9)] == [
        Counter({d: n for d, n in schedule.next().items() if n}) for _ in range(9)
    ]
    order = [quotas[w] for w in range(k + 1)]
    for w in range(8 - k):  # up to Q(8): later refills may have drawn quotas never admitted first
        order += [refills[w], quotas[w + k + 1]]
    for domain, rows in [("flat", 5), ("mixed", 7)]:
        drawn_ids = [i for ids in order for i in ids if i.startswith(domain)]
        stream = DomainStream(samples(domain, rows), seed=hash_seed(0, domain))
        assert drawn_ids == [s.id for s in stream.take(len(drawn_ids))]
