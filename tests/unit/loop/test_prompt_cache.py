"""The rollout manager's prompt ids: an LRU sized to the waves in flight (not every prompt ever
drawn), filled by a worker thread so tokenization never runs on the manager's event loop."""

from __future__ import annotations

import threading

from rlvr.collect.manager import RolloutManager
from rlvr.recipe.schema import Recipe
from rlvr.types import Sample
from tests.unit.loop.test_rollout_manager import CharTokenizer, FakeEngine, FakeRewards, drive


class RecordingTokenizer(CharTokenizer):
    """Tokenizes like CharTokenizer; remembers which thread asked and how often."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        self.threads.append(threading.current_thread().name)
        return super().__call__(text, add_special_tokens)


def test_prompt_ids_are_an_lru_filled_off_the_event_loop() -> None:
    rows = {
        d: [Sample(id=f"{d}{i}", tag=d, domain=d, messages=[{"role": "user", "content": f"{d} q{i}"}]) for i in range(40)]
        for d in ("flat", "mixed")
    }  # fmt: skip
    recipe = Recipe.model_validate({
        "experiment": {"max_steps": 12},
        "model": {"config": {}},
        "data": {"prompts_per_step": 4, "domain_interleave_probs": {"flat": 0.5, "mixed": 0.5}},
        "domains": {d: {"tags": [d], "files": ["x"], "reward": "math_rule"} for d in rows},
        "rollout": {"n": 3, "max_new_tokens": 10, "max_staleness": 1},
        "algorithm": {"preset": "grpo", "max_refill_rounds": 0, "tis_cap": 2.0},
    })  # fmt: skip
    tokenizer, engine = RecordingTokenizer(), FakeEngine(3)
    manager = RolloutManager(recipe, train=rows, evals={}, tokenizer=tokenizer, client=engine,  # type: ignore[arg-type]
                             rewards=FakeRewards())  # type: ignore[arg-type]  # fmt: skip
    try:
        results = drive(manager, engine, steps=range(12))
        # k = 1: two waves of 4 prompts in flight, one being taken -> 12 prompts' ids at most
        assert manager.prompts.capacity == 4 * (1 + 2)
        assert len(manager.prompts) <= manager.prompts.capacity
    finally:
        manager.close()
    assert sum(len(batch) for batch, _ in results) == 12 * 4 * 3  # every step trained its 4 groups
    assert len(tokenizer.threads) >= 12 * 4  # 48 prompts drawn, each tokenized (none twice within its wave)
    assert "rlvr-rollout" not in tokenizer.threads  # the manager's event loop never tokenized


def eval_manager(tokenizer: RecordingTokenizer, **monitor: int) -> RolloutManager:
    """A manager whose 6 held-out rows are also its training rows (domain "flat", reward 1 each)."""
    rows = {"flat": [Sample(id=f"e{i}", tag="flat", domain="flat", messages=[{"role": "user", "content": f"q{i}"}])
                     for i in range(6)]}  # fmt: skip
    recipe = Recipe.model_validate({
        "experiment": {"max_steps": 2},
        "model": {"config": {}},
        "data": {"prompts_per_step": 2, "domain_interleave_probs": {"flat": 1.0}},
        "domains": {"flat": {"tags": ["flat"], "files": ["x"], "reward": "math_rule"}},
        "rollout": {"n": 2, "max_new_tokens": 4},
        "monitor": monitor,
    })  # fmt: skip
    return RolloutManager(recipe, train=rows, evals=rows, tokenizer=tokenizer, client=FakeEngine(3),  # type: ignore[arg-type]
                          rewards=FakeRewards())  # type: ignore[arg-type]  # fmt: skip


def test_evaluation_tokenizes_off_the_event_loop_too() -> None:
    tokenizer = RecordingTokenizer()
    manager = eval_manager(tokenizer)
    try:
        manager.start(version=0)
        manager.evaluate(0)
    finally:
        manager.close()
    assert len(tokenizer.threads) >= 6 and "rlvr-rollout" not in tokenizer.threads


def test_eval_episodes_join_the_samples_marked_eval() -> None:
    """What the model answers greedily is kept (samples.jsonl), not only its training samples."""
    manager = eval_manager(RecordingTokenizer(), log_samples=3)
    try:
        manager.start(version=0)
        metrics = manager.evaluate(5)
        rows_logged = manager.pop_samples()
    finally:
        manager.close()
    assert metrics["eval/reward/flat/accuracy"] == 1.0
    assert [(r["step"], r["eval"], r["reward"]) for r in rows_logged] == [(5, True, 1.0)] * 3
    assert {r["id"] for r in rows_logged} == {"e0", "e1", "e2"} and manager.pop_samples() == []
