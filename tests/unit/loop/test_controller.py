"""The controller's batch shaping with a fake engine and fake rewards: dynamic sampling with refill,
overlong masking and shaping, per-domain normalisation, and resumable state."""

from __future__ import annotations

from typing import Any

from rlvr.controller import Controller
from rlvr.recipe.schema import Recipe
from rlvr.types import Completion, Group, RewardResult, Sample


class CharTokenizer:
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 100 + 3 for c in text]}


class FakeEngine:
    """Completion j of a prompt has j+1 tokens; the last one hits max_new_tokens (finish "length")."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    async def generate(self, requests: list[Any]) -> list[Completion]:
        self.calls.append(len(requests))
        out = []
        for request in requests:
            for j in range(request.n):
                length = request.params.max_new_tokens if j == request.n - 1 else j + 1
                out.append(Completion(text=str(j), token_ids=[7] * length, logprobs=[-0.5] * length,
                                      finish_reason="length" if j == request.n - 1 else "stop",
                                      prompt_token_ids=list(request.input_ids)))  # fmt: skip
        return out


class FakeRewards:
    """Domain "flat": every completion scores 1 (zero variance). Domain "mixed": completion j scores j."""

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        for group in groups:
            flat = group.sample.domain == "flat"
            group.rewards = [RewardResult(1.0 if flat else float(c.text)) for c in group.completions]
        return {"reward/fake/mean": 1.0}

    def close(self) -> None:
        pass


def samples(domain: str, count: int) -> list[Sample]:
    return [
        Sample(id=f"{domain}{i}", tag=domain, domain=domain, messages=[{"role": "user", "content": f"q{i}"}])
        for i in range(count)
    ]


def make(**algorithm: Any) -> tuple[Controller, FakeEngine]:
    recipe = Recipe.model_validate({
        "model": {"config": {}},
        "data": {"prompts_per_step": 4, "domain_interleave_probs": {"flat": 0.5, "mixed": 0.5}},
        "domains": {
            "flat": {"tags": ["flat"], "files": ["x"], "reward": "math_rule"},
            "mixed": {"tags": ["mixed"], "files": ["x"], "reward": "math_rule", "reward_norm": "domain"},
        },
        "rollout": {"n": 3, "max_new_tokens": 10},
        "algorithm": {"preset": "grpo", **algorithm},
    })  # fmt: skip
    engine = FakeEngine()
    controller = Controller(
        recipe,
        train={"flat": samples("flat", 5), "mixed": samples("mixed", 5)},
        evals={},
        tokenizer=CharTokenizer(),
        engine=engine,
        rewards=FakeRewards(),
    )  # type: ignore[arg-type]
    return controller, engine


def test_plain_grpo_keeps_every_group_and_masks_nothing() -> None:
    controller, engine = make()
    batch, metrics = controller.collect(0)
    assert len(batch) == 4 * 3 and engine.calls == [4]
    assert set(batch.domains) == {"flat", "mixed"}
    assert batch.loss_masks == [1.0] * 12
    assert metrics["batch/groups_dropped"] == 0
    rendered = [CharTokenizer()(f"user: q{i}\nassistant: ")["input_ids"] for i in range(5)]
    assert all(p in rendered for p in batch.prompts)  # the chat-rendered prompt, token for token


def test_dynamic_sampling_drops_flat_groups_and_refills_from_their_domain() -> None:
    controller, engine = make(dynamic_sampling=True, max_refill_rounds=2)
    batch, metrics = controller.collect(0)
    # flat groups never survive; each round refills from "flat" again, so only the 2 mixed groups remain
    assert engine.calls == [4, 2, 2]
    assert set(batch.domains) == {"mixed"} and len(batch) == 2 * 3
    assert metrics["batch/groups_dropped"] == 6


def test_overlong_mask_and_soft_penalty() -> None:
    controller, _ = make(overlong_mask=True, overlong_buffer=4, overlong_penalty=1.0)
    batch, _ = controller.collect(0)
    flat = [i for i, d in enumerate(batch.domains) if d == "flat"]
    # completion 2 of each group is 10 tokens = max_new_tokens: loss-masked and penalised by the full 1.0
    assert [batch.loss_masks[i] for i in flat[:3]] == [1.0, 1.0, 0.0]
    assert [batch.rewards[i] for i in flat[:3]] == [1.0, 1.0, 0.0]


def test_domain_normalisation_uses_running_stats_and_resumes() -> None:
    controller, _ = make()
    batch, _ = controller.collect(0)
    mixed = [batch.rewards[i] for i, d in enumerate(batch.domains) if d == "mixed"]
    assert abs(sum(mixed)) < 1e-6  # raw 0, 1, 2 per group, normalised by the domain's running mean/std
    state = controller.state_dict()
    again, _ = make()
    again.load_state_dict(state)
    assert [s.id for s in again.mixture.next_batch()] == [s.id for s in controller.mixture.next_batch()]
    assert again.domain_stats["mixed"].state_dict() == controller.domain_stats["mixed"].state_dict()
