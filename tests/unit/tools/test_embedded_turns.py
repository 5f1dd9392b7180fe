"""Tool turns on the real embedded engine: each turn's input is exactly the previous ids plus the
new ones, and the model's tokens are what the engine samples from that exact prefix."""

from __future__ import annotations

import string

import pytest

from rlvr.rollout.base import GenerateRequest, SamplingParams
from rlvr.rollout.episode import ToolReply, run_episode
from rlvr.server.embedded import EmbeddedEngine
from tests.conftest import build_sharp_model_dir


class EveryTokenIsACall:
    """A session whose stop strings are every printable character: each model turn is one token,
    answered with `[t]` until max_turns; it records the turn texts it was shown."""

    stop = list(string.printable)
    max_turns = 6
    max_tokens = 200

    def __init__(self, tokenizer):
        self.tokenizer, self.turns = tokenizer, []

    def decode(self, ids):
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def encode(self, text):
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def respond(self, text):
        self.turns.append(text)
        return ToolReply(text="[t]")

    def ends_with_call(self, text):
        return False

    def reset(self):
        self.turns = []

    def stats(self):
        return {"tool_calls": float(len(self.turns))}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = EmbeddedEngine(build_sharp_model_dir(tmp_path_factory.mktemp("tools") / "sharp"), max_batch=4, device="cpu")
    yield eng
    eng.close()


async def test_tool_turns_on_the_embedded_engine_are_token_in_token_out(engine):
    tokenizer = engine.tokenizer
    prompt = tokenizer.encode("what is 2+2?")
    session = EveryTokenIsACall(tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=50, ignore_eos=True)
    c = await run_episode(engine, prompt_ids=prompt, params=params, partial=True, tools=session)
    tool_ids = session.encode("[t]")
    assert c.tool_stats == {"turns": 6.0, "tool_calls": 5.0}
    assert c.loss_mask == ([1] + [0] * len(tool_ids)) * 5 + [1]
    model_positions = [i for i, m in enumerate(c.loss_mask) if m == 1]
    for i in model_positions:  # each model token is the greedy choice after exactly the ids before it
        one = SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True)
        (step,) = await engine.generate([GenerateRequest(prompt + c.token_ids[:i], one)])
        assert step.token_ids == [c.token_ids[i]]
        assert step.logprobs[0] == pytest.approx(c.logprobs[i], abs=1e-4)
    for i in range(len(c.token_ids)):
        if c.loss_mask[i] == 0:
            assert c.logprobs[i] == 0.0
    assert c.token_ids[1 : 1 + len(tool_ids)] == tool_ids
    assert session.turns == [tokenizer.decode([c.token_ids[i]]) for i in model_positions[:5]]
