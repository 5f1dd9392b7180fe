"""The rollout manager's parts on their own, through their public methods: the loop bridge, the
group ledger and failure budget, reward shaping, the prompt cache, the idle clock, reward-metric
merging, and the wave scheduler's gate and refill order. The manager's behaviour as a whole is
tests/unit/loop/test_rollout_manager.py."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rlvr.algorithms.shaping import RewardShaping
from rlvr.bridge import LoopThread
from rlvr.collect.ledger import GroupLedger
from rlvr.collect.prompts import PromptCache
from rlvr.collect.scheduler import Refill, Wave, WaveScheduler
from rlvr.collect.wave_metrics import IdleClock, merge_reward_metrics, staleness_metrics
from rlvr.data.mixture import MixtureSampler, WaveDraws
from rlvr.rewards.budget import StepFailures
from rlvr.types import GROUP_ENDS, Completion, Group, RewardResult, Sample
from tests.unit.loop.test_rollout_manager import CharTokenizer, recipe, samples


def group(
    domain: str = "mixed", *, lengths: tuple[int, ...] = (1, 2, 10), scores: tuple[float, ...] = (0, 1, 2)
) -> Group:
    completions = [
        Completion(text="", token_ids=[3] * n, logprobs=[-1.0] * n, finish_reason="length" if n == 10 else "stop")
        for n in lengths
    ]
    return Group(sample=samples(domain, 1)[0], completions=completions, rewards=[RewardResult(s) for s in scores])


def test_the_bridge_runs_inline_until_started_then_on_its_thread() -> None:
    bridge = LoopThread(name="rlvr-test-loop")

    async def where() -> str:
        return threading.current_thread().name

    assert bridge.call(where()) == threading.current_thread().name
    bridge.start()
    assert bridge.call(where()) == "rlvr-test-loop"
    bridge.stop()
    bridge.close()
    assert bridge.loop.is_closed()


def test_the_ledger_ends_every_group_once_and_counts_how() -> None:
    ledger = GroupLedger(recipe())
    a, b = group(), group()
    ledger.start(a)
    ledger.start(b)
    ledger.end("trained", [a])
    with pytest.raises(RuntimeError, match="ended as filtered but was not in flight"):
        ledger.end("filtered", [a])
    assert ledger.metrics()["groups/in_flight"] == 1.0
    ledger.cancel_live()
    assert ledger.counts == {"started": 2, "trained": 1, "stale": 0, "filtered": 0, "failed": 0, "cancelled": 1}
    assert set(ledger.metrics()) == {f"groups/{k}" for k in ("started", *GROUP_ENDS)} | {"groups/in_flight"}


def test_the_ledger_takes_unjudged_samples_out_and_the_budget_says_when_to_stop() -> None:
    ledger = GroupLedger(recipe(max_failed_frac=0.25))
    g = group()
    g.rewards[1] = RewardResult(0.0, failed="RuntimeError: down")
    tallies: dict[str, StepFailures] = {}
    assert ledger.judged_only(g, tallies)  # two judged samples left: enough to compare
    assert g.scores == [0, 2] and [len(c.token_ids) for c in g.completions] == [1, 10]
    assert tallies["mixed"] == StepFailures(total=3, failed=1, cause="RuntimeError: down")
    assert ledger.report(1, tallies) == [
        "reward mixed could not judge 1 of 3 samples in step 1 (not trained on): RuntimeError: down"
    ]
    assert ledger.stop_reason == "reward mixed could not judge 1 of 3 samples in step 1: RuntimeError: down"
    lone = group()
    lone.rewards[:2] = [RewardResult(0.0, failed="x")] * 2
    assert not ledger.judged_only(lone, tallies)


def test_the_ledger_resumes_its_counts_with_what_was_in_flight_cancelled() -> None:
    ledger = GroupLedger(recipe())
    ledger.load_counts({"started": 10, "trained": 6, "filtered": 1, "unknown": 5})
    assert ledger.counts["cancelled"] == 3 and "unknown" not in ledger.counts


def test_shaping_penalises_overlong_responses_by_each_domain_s_budget() -> None:
    r = recipe(overlong_buffer=4, overlong_penalty=1.0)
    shaping = RewardShaping(r.algorithm, rollout=r.rollout, episode_tokens={"flat": 20}, normalized=[])
    # max_new_tokens = 10: 10 tokens is the full penalty; a tool domain's budget of 20 leaves them alone
    assert shaping.shaped_rewards(group("mixed", lengths=(1, 7, 10))) == [0.0, 1.0 - 0.25, 2.0 - 1.0]
    assert shaping.shaped_rewards(group("flat", lengths=(1, 7, 10))) == [0.0, 1.0, 2.0]


def test_shaping_normalises_per_domain_masks_overlong_and_resumes() -> None:
    r = recipe(overlong_mask=True)
    shaping = RewardShaping(r.algorithm, rollout=r.rollout, episode_tokens={}, normalized=["mixed"])
    batch = shaping.build_batch([group("mixed"), group("flat", scores=(1, 1, 1))])
    assert batch.rewards[3:] == [1.0, 1.0, 1.0]  # flat: not normalised
    assert abs(sum(batch.rewards[:3])) < 1e-6 and batch.rewards[0] < 0 < batch.rewards[2]
    assert batch.loss_masks == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]  # a response cut at max_new_tokens
    again = RewardShaping(r.algorithm, rollout=r.rollout, episode_tokens={}, normalized=["mixed"])
    again.load_state_dict(shaping.state_dict())
    assert again.state_dict() == shaping.state_dict() == {"mixed": {"count": 3.0, "mean": 1.0, "m2": 2.0}}


def test_the_prompt_cache_evicts_the_least_recent_and_drops_long_prompts() -> None:
    r = recipe()
    r.data.max_prompt_tokens = 18
    cache = PromptCache(r, tokenizer=CharTokenizer(), toolboxes={}, eval_rows=0)
    cache.capacity = 2
    rows = samples("mixed", 3) + [Sample(id="s", tag="flat", domain="flat", messages=[{"role": "user", "content": ""}])]
    first = cache.prompt_ids(rows[0])
    cache.prompt_ids(rows[1])
    assert cache.prompt_ids(rows[0]) is first  # cached
    cache.prompt_ids(rows[2])  # evicts rows[1], the least recently asked
    assert len(cache) == 2 and cache.prompt_ids(rows[0]) is first
    dropped: dict[str, list[tuple[str, int]]] = {}
    assert cache.fits(rows, dropped=dropped) == [rows[3]]
    assert dropped == {"mixed": [("mixed0", 20), ("mixed1", 20), ("mixed2", 20)]}
    assert cache.prompt_text(rows[0]) == "user: q0\nassistant: "


def test_the_idle_clock_measures_the_share_of_time_nothing_was_generating() -> None:
    clock = IdleClock()
    clock.started()
    time.sleep(0.02)
    assert clock.idle_frac() < 0.5
    clock.ended()
    time.sleep(0.02)
    assert clock.idle_frac() > 0.5


def test_reward_metrics_merge_counts_means_and_tails() -> None:
    parts = [
        {"reward/m/count": 1.0, "reward/m/mean": 1.0, "reward/m/latency_p95_s": 2.0, "reward/m/calls_total": 5.0},
        {"reward/m/count": 3.0, "reward/m/mean": 0.0, "reward/m/latency_p95_s": 1.0, "reward/m/calls_total": 8.0},
    ]
    assert merge_reward_metrics(parts) == {
        "reward/m/count": 4.0,
        "reward/m/mean": 0.25,
        "reward/m/latency_p95_s": 2.0,
        "reward/m/calls_total": 8.0,
    }


def test_staleness_metrics_measure_the_oldest_token_against_the_step() -> None:
    g = group(lengths=(1, 2))
    g.completions[0].token_versions, g.completions[1].token_versions = [1], [2, 3]
    assert staleness_metrics([g], step=3, max_staleness=2) == {
        "rollout/staleness_max": 2.0,
        "rollout/staleness_mean": 1.5,
        "rollout/partial_frac": 0.5,
        "rollout/staleness_hist/0": 0.0,
        "rollout/staleness_hist/1": 0.5,
        "rollout/staleness_hist/2": 0.5,
    }


def test_the_gate_admits_k_waves_ahead_and_refills_wait_for_earlier_waves() -> None:
    r = recipe(k=1, steps=4)
    mixture = MixtureSampler(
        {"flat": samples("flat", 5), "mixed": samples("mixed", 5)},
        probs=r.data.domain_interleave_probs,
        prompts_per_step=r.data.prompts_per_step,
        seed=0,
    )
    order: list[str] = []
    release = asyncio.Event()

    async def collect(wave: Wave, refill: Refill) -> None:
        if wave.step == 0:
            await release.wait()  # wave 0 still refilling while wave 1 asks
        wave.kept = [Group(sample=s, completions=[]) for s in await refill(wave.step, ["mixed"])]
        order.append(f"refilled {wave.step}")

    async def run() -> None:
        ready = asyncio.Event()
        scheduler = WaveScheduler(
            r, draws=WaveDraws(mixture, ahead=1), loop=asyncio.get_running_loop(), weights_ready=ready, collect=collect
        )
        await scheduler.open_gate(0, first_wave=0)
        assert sorted(scheduler.waves) == [0, 1] and ready.is_set()  # waves 0 and 0 + k
        await scheduler.close_gate()
        assert not ready.is_set()
        await asyncio.sleep(0.01)
        assert order == []  # wave 1's refill waits for wave 0's
        release.set()
        wave, _ = await scheduler.finished(0)
        assert wave.step == 0 and len(wave.kept) == 1
        await scheduler.open_gate(1)
        assert sorted(scheduler.waves) == [1, 2] and scheduler.version == 1
        await scheduler.finished(1)
        await scheduler.cancel()
        assert scheduler.waves == {}

    asyncio.run(run())
    assert order[:2] == ["refilled 0", "refilled 1"]
