"""The rollout manager with a fake engine and fake rewards: batch shaping (dynamic sampling with
refill, overlong masking and shaping, per-domain normalisation), the staleness bound under random
delays and weight pushes, group conservation, k = 0 against the synchronous loop, and resume."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from rlvr.algorithms.filters import keep_group
from rlvr.controller import GROUP_ENDS, RolloutManager
from rlvr.data.chat import encode_prompt
from rlvr.data.mixture import MixtureSampler, hash_seed
from rlvr.recipe.schema import Recipe
from rlvr.types import Completion, Group, RewardResult, Sample


class CharTokenizer:
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 100 + 3 for c in text]}


class FakeEngine:
    """Sample j of a prompt (j = how many times that prompt was asked, mod n) has j+1 tokens; the last
    one runs to max_new_tokens (finish "length"). Tokens come out one per `delay` tick; `pause()`
    aborts what is in flight with its tokens so far, and `version` is stamped on every reply.
    Token values are derived from the seed so batches can be compared across schedules."""

    def __init__(self, n: int, *, delay: float = 0.0, jitter: float = 0.0, seed: int = 0) -> None:
        self.n, self.delay, self.jitter = n, delay, jitter
        self.rng = random.Random(seed)
        self.seen: Counter[tuple[int, ...]] = Counter()
        self.calls = 0
        self.version = 0
        self.paused = False
        self.in_flight: set[asyncio.Event] = set()

    async def generate(self, requests: list[Any]) -> list[Completion]:
        (request,) = requests
        self.calls += 1
        assert not self.paused, "a request reached a paused engine"
        prompt = tuple(request.input_ids)
        j = self.seen[prompt] % self.n
        self.seen[prompt] += 1
        budget = request.params.max_new_tokens
        length = budget if j == self.n - 1 else min(j + 1, budget)
        abort = asyncio.Event()
        self.in_flight.add(abort)
        tokens: list[int] = []
        seed = request.params.seed or 0
        try:
            for i in range(length):
                if self.delay or self.jitter:
                    await asyncio.sleep(self.delay + self.rng.random() * self.jitter)
                if abort.is_set():
                    return [self._completion(request, j, tokens, "abort")]
                tokens.append(3 + (seed + i) % 50)
            return [self._completion(request, j, tokens, "length" if length == budget else "stop")]
        finally:
            self.in_flight.discard(abort)

    def _completion(self, request: Any, j: int, tokens: list[int], finish: str) -> Completion:
        return Completion(text=str(j), token_ids=tokens, logprobs=[-0.5] * len(tokens), finish_reason=finish,
                          prompt_token_ids=list(request.input_ids), policy_version=self.version)  # fmt: skip

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


def make(engine: FakeEngine | None = None, **kw: Any) -> tuple[RolloutManager, FakeEngine]:
    engine = engine or FakeEngine(3)
    manager = RolloutManager(
        recipe(**kw),
        train={"flat": samples("flat", 5), "mixed": samples("mixed", 5)},
        evals={},
        tokenizer=CharTokenizer(),
        engine=engine,  # type: ignore[arg-type]
        rewards=FakeRewards(),  # type: ignore[arg-type]
    )
    return manager, engine


def drive(manager: RolloutManager, engine: FakeEngine, *, steps: range) -> list[tuple[Any, dict[str, float]]]:
    """The loop's protocol with the manager: take, (train), pause, push, resume."""
    out = []
    manager.start(version=steps.start)
    for step in steps:
        out.append(manager.take(step))
        manager.pause()
        manager.loop.call_soon_threadsafe(engine.push, step + 1)
        manager.resume(version=step + 1)
    return out


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
    assert again.domain_stats["mixed"].state_dict() == manager.domain_stats["mixed"].state_dict()
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
                    request.params = manager.sampling(seed=seed + j)
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
                          tokenizer=CharTokenizer(), engine=FakeEngine(3),  # type: ignore[arg-type]
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
    manager.recipe.data.max_prompt_tokens = len(manager.prompt_ids(short[0]))  # the "mixed" rows say "qN": longer
    batch, metrics = manager.take(0)
    manager.close()
    assert (
        set(batch.domains) == {"flat"} and metrics["data/mixed/dropped"] == 2.0 and "data/flat/dropped" not in metrics
    )
    assert manager.pop_events() == [
        "data mixed: 2 row(s) skipped in step 1, prompt longer than data.max_prompt_tokens = 18 (first: id mixed0, "
        "20 tokens)"
    ]
