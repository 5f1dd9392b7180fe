"""Adaptive shares follow each domain's informative groups within bounds; difficulty pools rest
prompts that keep coming back alike; both resume exactly through the wave draws."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.data.adaptive import AdaptiveShares, DifficultyPool, GroupOutcome, bounded_shares
from rlvr.data.mixture import DomainStream, MixtureSampler, WaveDraws
from tests.unit.data.test_mixture import make_domains

LOOSE = (0.0, 1.0)


def outcome(domain: str, scores: list[float], sample_id: str = "x") -> GroupOutcome:
    return GroupOutcome(domain, sample_id, tuple(scores))


def test_bounded_shares_by_hand() -> None:
    # c's 0.8 is cut to its ceiling and a and b share the rest equally
    assert bounded_shares({"a": 1, "b": 1, "c": 8}, {"a": LOOSE, "b": LOOSE, "c": (0.0, 0.5)}) == {
        "a": 0.25, "b": 0.25, "c": 0.5,
    }  # fmt: skip
    # a tiny weight is lifted to its floor, the others keep their ratio
    got = bounded_shares({"a": 0.001, "b": 1, "c": 3}, {"a": (0.2, 1.0), "b": LOOSE, "c": LOOSE})
    assert got == pytest.approx({"a": 0.2, "b": 0.2, "c": 0.6})
    # one domain at its ceiling, the two with no weight split the rest
    got = bounded_shares({"a": 1, "b": 0, "c": 0}, {"a": (0.0, 0.6), "b": (0.1, 1.0), "c": (0.1, 1.0)})
    assert got == pytest.approx({"a": 0.6, "b": 0.2, "c": 0.2})


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 10.0), min_size=1, max_size=5),
    st.lists(st.tuples(st.floats(0.0, 0.2), st.floats(0.3, 1.0)), min_size=5, max_size=5),
)
def test_bounded_shares_sum_to_one_within_bounds(weights: list[float], bounds: list[tuple[float, float]]) -> None:
    names = [f"d{i}" for i in range(len(weights))]
    box = dict(zip(names, bounds, strict=False))
    if sum(lo for lo, _ in box.values()) > 1 or sum(hi for _, hi in box.values()) < 1:
        return  # validate refuses such bounds
    shares = bounded_shares(dict(zip(names, weights, strict=True)), box)
    assert sum(shares.values()) == pytest.approx(1.0)
    for name, share in shares.items():
        assert box[name][0] - 1e-9 <= share <= box[name][1] + 1e-9


def test_a_domain_that_stops_teaching_falls_to_its_floor_and_comes_back() -> None:
    shares = AdaptiveShares({"math": 0.5, "code": 0.5}, bounds={"math": (0.1, 0.9), "code": (0.1, 0.9)}, smoothing=0.5)
    assert shares.shares() == {"math": 0.5, "code": 0.5}  # starts at the recipe's mix
    for _ in range(8):  # math's groups all come back alike, code's all have a spread
        shares.observe([outcome("math", [1, 1])] * 4 + [outcome("code", [0, 1])] * 4)
    assert shares.shares()["math"] == pytest.approx(0.1)  # held at its floor, never starved
    for _ in range(8):
        shares.observe([outcome("math", [0, 1])] * 4 + [outcome("code", [0, 1])] * 4)
    assert shares.shares()["math"] == pytest.approx(0.5, abs=0.01)
    assert shares.signal["math"] == pytest.approx(1 - (1 - 0.5**8) * 0.5**8)  # the moving average, by hand


def test_one_wave_moves_the_signal_by_the_smoothing() -> None:
    shares = AdaptiveShares({"a": 0.75, "b": 0.25}, bounds={"a": LOOSE, "b": LOOSE}, smoothing=0.25)
    shares.observe([outcome("a", [1, 1]), outcome("a", [0, 1]), outcome("b", [0, 0])])
    assert shares.signal == {"a": pytest.approx(1 - 0.25 * 0.5), "b": pytest.approx(0.75)}
    weights = {"a": 0.75 * 0.875, "b": 0.25 * 0.75}
    total = sum(weights.values())
    assert shares.shares() == pytest.approx({k: v / total for k, v in weights.items()})


def test_verdicts() -> None:
    assert outcome("a", [1.0, 1.0]).verdict == "solved" and not outcome("a", [1.0, 1.0]).informative
    assert outcome("a", [0.0, 0.0]).verdict == "failed"
    assert outcome("a", [0.5, 0.5]).verdict == "mixed" and not outcome("a", [0.5, 0.5]).informative
    assert outcome("a", [0.0, 1.0]).verdict == "mixed" and outcome("a", [0.0, 1.0]).informative


def test_a_prompt_rests_after_k_alike_groups_in_a_row_and_comes_back_after_the_set_steps() -> None:
    pool = DifficultyPool(retire_after=2, revisit_after=10, revisit_rate=None, seed=0)
    pool.observe(outcome("a", [1, 1], "p"), step=1)
    pool.observe(outcome("a", [0, 1], "p"), step=2)  # a spread breaks the streak
    pool.observe(outcome("a", [1, 1], "p"), step=3)
    assert pool.active("p", step=3, visit=0)
    pool.observe(outcome("a", [0, 0], "p"), step=4)  # a different verdict starts a new streak
    assert pool.active("p", step=4, visit=0)
    pool.observe(outcome("a", [0, 0], "p"), step=5)
    assert pool.counts() == {"resting_solved": 0, "resting_failed": 1}
    assert not pool.active("p", step=14, visit=0)
    assert pool.active("p", step=15, visit=0)  # 10 steps later it is back, its streak reset
    assert pool.counts() == {"resting_solved": 0, "resting_failed": 0}


def test_all_wrong_prompts_can_be_given_longer_before_they_rest() -> None:
    pool = DifficultyPool(retire_after=1, retire_failed_after=3, revisit_after=10, revisit_rate=None, seed=0)
    pool.observe(outcome("a", [1, 1], "easy"), step=1)
    for step in (1, 2):
        pool.observe(outcome("a", [0, 0], "hard"), step=step)
    assert not pool.active("easy", step=2, visit=0) and pool.active("hard", step=2, visit=0)
    pool.observe(outcome("a", [0, 0], "hard"), step=3)  # the third all-wrong group in a row
    assert pool.counts() == {"resting_solved": 1, "resting_failed": 1}


def test_resting_prompts_are_revisited_at_the_set_rate() -> None:
    pool = DifficultyPool(retire_after=1, revisit_after=None, revisit_rate=0.25, seed=3)
    for i in range(400):
        pool.observe(outcome("a", [1, 1], f"p{i}"), step=0)
    drawn = [pool.active(f"p{i}", step=100, visit=1) for i in range(400)]
    assert 0.18 < sum(drawn) / 400 < 0.32
    assert drawn == [pool.active(f"p{i}", step=100, visit=1) for i in range(400)]  # seeded


def test_the_walk_passes_resting_rows_and_wakes_the_longest_resting_when_all_rest() -> None:
    samples = make_domains({"a": 6})["a"]
    pool = DifficultyPool(retire_after=1, revisit_after=None, revisit_rate=None, seed=0)
    stream = DomainStream(samples, seed=1)
    order = [s.id for s in DomainStream(samples, seed=1).take(6)]
    for sid in order[:3]:
        pool.observe(outcome("a", [1, 1], sid), step=0)
    assert [s.id for s in stream.take(3, pool=pool)] == order[3:]
    for sid in order[3:]:
        pool.observe(outcome("a", [0, 0], sid), step=2)
    assert stream.take(4, pool=pool, active_only=True) == []  # every row rests: one whole pass, then stop
    woken = [s.id for s in stream.take(4, pool=pool)]  # or the rows that rested longest are woken
    assert set(woken[:3]) == set(order[:3]) and woken[3] in order[3:]  # those of step 0, then one of step 2
    assert pool.counts() == {"resting_solved": 0, "resting_failed": 2}  # woken rows are back in the pool
    for sid in woken:
        pool.observe(outcome("a", [1, 1], sid), step=3)
    assert {s.id for s in stream.take(2, pool=pool)} == set(order[3:]) - {woken[3]}  # now the oldest


def test_a_domain_whose_rows_all_rest_lends_its_quota_and_a_step_stays_full() -> None:
    domains = make_domains({"a": 4, "b": 20, "c": 20})
    pools = {n: DifficultyPool(retire_after=1, revisit_after=None, revisit_rate=None, seed=0) for n in "abc"}
    mixture = MixtureSampler(domains, probs={"a": 0.5, "b": 0.2, "c": 0.3}, prompts_per_step=10, seed=5, pools=pools)

    def rest(domain: str) -> None:
        for sample in domains[domain]:
            pools[domain].observe(outcome(domain, [1, 1], sample.id), step=0)

    def tags() -> list[str]:
        return [s.tag for s in mixture.next_batch()]

    assert sorted(tags()) == ["a"] * 5 + ["b"] * 2 + ["c"] * 3  # the quota: 5 / 2 / 3
    rest("a")
    assert sorted(tags()) == ["b"] * 4 + ["c"] * 6  # a's 5 lent one at a time, the larger share first
    rest("b")
    assert tags() == ["c"] * 10  # only c has active rows left
    rest("c")
    assert sorted(tags()) == ["a"] * 5 + ["b"] * 2 + ["c"] * 3  # none has: resting rows, by the quota


def observing_mixture(domains, *, adaptive: bool, pools: bool) -> MixtureSampler:
    names, probs = list(domains), {"a": 0.5, "b": 0.3, "c": 0.2}
    shares = AdaptiveShares(probs, bounds=dict.fromkeys(names, (0.1, 0.8)), smoothing=0.5)
    return MixtureSampler(
        domains, probs=probs, prompts_per_step=6, seed=5,
        shares=shares if adaptive else None,
        pools={n: DifficultyPool(retire_after=2, revisit_after=4, revisit_rate=None, seed=1) for n in names} if pools else None,
    )  # fmt: skip


def run_waves(draws: WaveDraws, steps: range) -> list[list[str]]:
    """Synchronous waves as the rollout manager drives them: quota, a refill every third step, finish
    with outcomes that depend on the prompt only."""
    out = []
    for step in steps:
        prompts = draws.quota(step)
        refill = draws.refill(step, prompts[0].tag or "a", 1) if step % 3 == 0 else []
        groups = prompts + refill
        scores = [[float(zlib_hash(s.id) % 3 == 0)] * 2 if zlib_hash(s.id) % 2 else [0.0, 1.0] for s in groups]
        draws.finish(step, [GroupOutcome(s.tag or "a", s.id, tuple(sc)) for s, sc in zip(groups, scores, strict=True)])
        out.append([s.id for s in groups])
    return out


def zlib_hash(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())


@pytest.mark.parametrize(("adaptive", "pools"), [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("stop_at", [1, 4, 7])
def test_a_resumed_run_draws_what_the_straight_run_drew(adaptive: bool, pools: bool, stop_at: int) -> None:
    domains = make_domains({"a": 9, "b": 5, "c": 4})
    straight = run_waves(WaveDraws(observing_mixture(domains, adaptive=adaptive, pools=pools), ahead=0), range(12))
    first = WaveDraws(observing_mixture(domains, adaptive=adaptive, pools=pools), ahead=0)
    run_waves(first, range(stop_at))
    state = json.loads(json.dumps(first.state_dict(stop_at)))  # checkpoints are JSON-safe
    resumed = WaveDraws(observing_mixture(domains, adaptive=adaptive, pools=pools), ahead=0)
    resumed.load_state_dict(copy.deepcopy(state))
    assert run_waves(resumed, range(stop_at, 12)) == straight[stop_at:]
    changed = run_waves(WaveDraws(observing_mixture(domains, adaptive=False, pools=False), ahead=0), range(12))
    assert changed != straight  # the outcomes did change what was drawn


def test_wave_draws_one_ahead_apply_a_waves_outcomes_before_the_quota_after_next() -> None:
    """k = 1: wave s's groups move the mix from Q(s + 2) on, whatever order quotas are drawn in."""
    domains = make_domains({"a": 9, "b": 5, "c": 4})
    draws = WaveDraws(observing_mixture(domains, adaptive=True, pools=False), ahead=1)
    draws.quota(0)
    draws.quota(1)
    draws.finish(0, [GroupOutcome("a", "a-0", (1.0, 1.0))] * 6)
    before = dict(draws.mixture.quotas.probs)
    draws.quota(2)  # Q(2) comes after R(0) and wave 0's outcomes
    assert draws.mixture.quotas.probs["a"] < before["a"]


def run_waves_one_ahead(draws: WaveDraws, steps: range) -> list[list[str]]:
    """k = 1 as the manager drives it: wave s+1's quota is drawn before wave s refills and finishes."""
    out, early = [], {}
    for step in steps:
        prompts = early.pop(step, None) or draws.quota(step)
        early[step + 1] = draws.quota(step + 1)
        refill = draws.refill(step, prompts[0].tag or "a", 1) if step % 3 == 0 else []
        groups = prompts + refill
        draws.finish(step, [GroupOutcome(s.tag or "a", s.id, (float(zlib_hash(s.id) % 2),) * 2) for s in groups])
        out.append([s.id for s in groups])
    return out


@pytest.mark.parametrize("stop_at", [1, 2, 5])
def test_a_resumed_run_one_ahead_draws_what_the_straight_run_drew(stop_at: int) -> None:
    domains = make_domains({"a": 9, "b": 5, "c": 4})
    fresh = lambda: WaveDraws(observing_mixture(domains, adaptive=True, pools=True), ahead=1)  # noqa: E731
    straight = run_waves_one_ahead(fresh(), range(10))
    first = fresh()
    run_waves_one_ahead(first, range(stop_at))  # wave stop_at's quota is drawn already, as in the loop
    resumed = fresh()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict(stop_at))))
    assert run_waves_one_ahead(resumed, range(stop_at, 10)) == straight[stop_at:]
