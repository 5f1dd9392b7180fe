"""The rollout manager runs multi-turn episodes for a domain with tools: the prompt lists the
tools, every episode calls one, per-token masks reach the TrainBatch, and tools/* metrics appear."""

from __future__ import annotations

from typing import Any

from rlvr.collect.manager import RolloutManager
from rlvr.recipe.schema import Recipe
from rlvr.types import Completion, Group, RewardResult, Sample

PLUGIN = "tests.unit.tools.plugin_example:lookup_price"


class PriceEngine:
    """Turn 1 asks the tool for an apple's price; after a <result>, answers with the last number seen."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.inputs: list[str] = []

    async def generate(self, requests: list[Any]) -> list[Completion]:
        (request,) = requests
        seen = self.tokenizer.decode(request.input_ids)
        self.inputs.append(seen)
        if seen.endswith("</result>\n"):
            text, ids = "price 3", self.tokenizer("price 3")["input_ids"] + [self.tokenizer.eos_token_id]
        else:
            text = "<lookup_price>apple</lookup_price>"
            ids = self.tokenizer(text)["input_ids"]
        return [
            Completion(text=text, token_ids=ids, logprobs=[-1.0] * len(ids), prompt_token_ids=list(request.input_ids))
        ]


class Rewards:
    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        for group in groups:
            group.rewards = [RewardResult(float(c.text.endswith("price 3"))) for c in group.completions]
        return {}

    def close(self) -> None:
        pass


def test_a_tool_domain_runs_turns_and_masks_tool_tokens(tokenizer) -> None:
    from rlvr.trainer.batch import TrainBatch

    recipe = Recipe.model_validate({
        "experiment": {"max_steps": 2},
        "model": {"config": {}, "chat_template": "plain"},
        "data": {"prompts_per_step": 2},
        "domains": {"shop": {"tags": ["shop"], "files": ["x"], "reward": "qa_match", "tools": [PLUGIN],
                             "max_episode_tokens": 600}},
        "rollout": {"n": 2, "max_new_tokens": 100},
    })  # fmt: skip
    train = [
        Sample(id=str(i), tag="shop", domain="shop", messages=[{"role": "user", "content": f"q{i}"}]) for i in range(4)
    ]
    engine = PriceEngine(tokenizer)
    manager = RolloutManager(recipe, train={"shop": train}, evals={}, tokenizer=tokenizer, client=engine,  # type: ignore[arg-type]
                             rewards=Rewards())  # type: ignore[arg-type]  # fmt: skip
    try:
        batch, metrics = manager.take(0)
    finally:
        manager.close()
    assert "<lookup_price>JSON arguments</lookup_price>" in engine.inputs[0]  # the prompt lists the tool
    assert metrics["turns/shop"] == 2.0 and metrics["tools/shop/calls_per_episode"] == 1.0
    assert metrics["tools/shop/call_rate"] == 1.0 and metrics["tools/shop/errors"] == 0.0
    assert metrics["tools/shop/timeouts"] == 0.0 and metrics["tools/shop/latency_s"] >= 0.0
    assert batch.rewards == [1.0] * 4
    tool_text = "\n<result>\n3\n</result>\n"
    tool_len = len(tokenizer(tool_text)["input_ids"])
    for response, mask, logprobs in zip(batch.responses, batch.loss_masks, batch.rollout_logprobs, strict=True):
        assert isinstance(mask, list) and len(mask) == len(response)
        assert mask.count(0.0) == tool_len and all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
    train_batch = TrainBatch.from_sequences(batch.prompts, batch.responses, response_masks=batch.loss_masks)
    assert train_batch.response_mask.sum().item() == sum(len(r) - tool_len for r in batch.responses)


def test_a_train_row_and_an_eval_row_with_the_same_id_keep_their_own_prompts(tokenizer) -> None:
    recipe = Recipe.model_validate({
        "experiment": {"max_steps": 1},
        "model": {"config": {}, "chat_template": "plain"},
        "domains": {"shop": {"tags": ["shop"], "files": ["x"], "reward": "qa_match"}},
    })  # fmt: skip
    train = Sample(id="7", tag="shop", domain="shop", messages=[{"role": "user", "content": "train"}])
    held_out = Sample(id="7", tag="shop", domain="shop", messages=[{"role": "user", "content": "eval"}])
    manager = RolloutManager(recipe, train={"shop": [train]}, evals={"shop": [held_out]}, tokenizer=tokenizer,
                             client=PriceEngine(tokenizer), rewards=Rewards())  # type: ignore[arg-type]  # fmt: skip
    try:
        assert manager.prompts.prompt_text(held_out).endswith("user: eval\nassistant: ")
        assert manager.prompts.prompt_text(train).endswith("user: train\nassistant: ")
    finally:
        manager.close()
