"""One sample's episode: token in, token out, surviving weight updates.

An episode owns one sequence from its prompt to its end. It sends `prompt + tokens so far`
to the engine and appends what comes back; it never re-tokenises text, so the ids the
trainer sees are exactly the ids the engine sampled. When a weight update pauses the
engine with `abort`, the engine returns the partial response with finish_reason "abort":

- `partial = True` (partial rollout, as slime's `--partial-rollout` and verl's fully-async
  recipe): keep those tokens and their logprobs, wait until the new weights are in, and
  continue with the remaining budget. Each token remembers the weight version that sampled
  it, so the buffer can bound staleness by the oldest one and the trainer can correct.
- `partial = False`: drop them and restart from the prompt under the new weights.

With `tools` (a `ToolSession`), the episode has turns: generation stops at the end of a tool
call (the session's stop strings), the session runs the tool, its answer is appended *as
tokens* and generation continues. Every request's input is exactly the previous request's
ids plus the new ones -- the model's sampled ids are never decoded and re-encoded, so no
separator can drift at the assistant -> tool boundary. Tool tokens get loss mask 0 and
logprob 0; an abort mid-turn continues that turn like a single-turn episode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rlvr.rollout.engine import GenerateRequest, RolloutEngine, RolloutError, SamplingParams
from rlvr.types import Completion

# Each weight update an episode spans aborts it once; far more means an engine aborts in a loop.
MAX_ABORTS = 64


async def _no_wait() -> None:
    return None


@dataclass(slots=True)
class ToolReply:
    """The session's answer to one model turn: `text` to append (already wrapped in the tool
    format's result markup), or `more` when the turn stopped inside an unfinished call (a
    fence opened): nothing is appended and the same turn keeps generating."""

    text: str = ""
    more: bool = False


class ToolSession(Protocol):
    """One episode's tools (`rlvr.tools.session.ToolSession` implements it)."""

    stop: list[str]
    max_turns: int
    max_tokens: int

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    async def respond(self, text: str) -> ToolReply | None:
        """The reply to a model turn's text; None when the turn holds no call (the episode ends)."""
        ...

    def reset(self) -> None: ...

    def stats(self) -> dict[str, float]: ...


@dataclass(slots=True)
class EpisodeState:
    """What an episode has produced so far (kept across aborts when partial)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    text: str = ""
    aborts: int = 0
    requests: int = 0
    turns: int = 1
    turn_start: int = 0  # where the current model turn's tokens begin

    def extend(self, part: Completion) -> None:
        self.token_ids += part.token_ids
        self.logprobs += part.logprobs
        # an engine that tags tokens itself (vLLM, across an in-place pause) says which version made each
        self.versions += part.token_versions or [part.policy_version] * len(part.token_ids)
        self.mask += [1] * len(part.token_ids)
        self.text += part.text

    def append_tool(self, ids: list[int], text: str, *, version: int) -> None:
        """Tool output: appended as ids, no logprob, masked out of the loss."""
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [version] * len(ids)
        self.mask += [0] * len(ids)
        self.text += text
        self.turns += 1
        self.turn_start = len(self.token_ids)

    def reset(self) -> None:
        self.token_ids, self.logprobs, self.versions, self.mask, self.text = [], [], [], [], ""
        self.turns, self.turn_start = 1, 0


async def run_episode(
    engine: RolloutEngine,
    *,
    prompt_ids: list[int],
    params: SamplingParams,
    partial: bool,
    weights_ready: Callable[[], Awaitable[object]] = _no_wait,
    tools: ToolSession | None = None,
) -> Completion:
    """Generate one response to `prompt_ids`, continuing across aborts (see the module docstring).

    `weights_ready` is awaited before every request: the rollout manager closes it while a
    weight update runs, so a resend never reaches a paused engine mid-update. With `tools`
    the token budget is the session's (model and tool tokens together) and
    `params.max_new_tokens` is unused.
    """
    state = EpisodeState()
    limit = params.max_new_tokens if tools is None else tools.max_tokens
    stop = list(params.stop) if tools is None else [*params.stop, *tools.stop]
    finish, version = "length", 0
    while True:
        budget = limit - len(state.token_ids)
        if budget <= 0:
            finish = "length"
            break
        await weights_ready()
        # The same seed on a later request would replay the first draws on new positions; shift it.
        seed = None if params.seed is None else params.seed + 1_000_003 * state.requests
        state.requests += 1
        request = GenerateRequest(
            input_ids=prompt_ids + state.token_ids,
            params=dataclasses.replace(params, max_new_tokens=budget, seed=seed, stop=stop),
            n=1,
        )
        (part,) = await engine.generate([request])
        version = part.policy_version
        if part.finish_reason == "abort":
            state.aborts += 1
            if state.aborts > MAX_ABORTS:
                raise RolloutError(f"a generation was aborted {state.aborts} times in a row")
            if partial:
                state.extend(part)
            else:
                state.reset()
                if tools is not None:
                    tools.reset()
            continue
        state.extend(part)
        finish = part.finish_reason
        if tools is None or finish != "stop" or not part.token_ids:
            break
        finish = await _tool_turn(tools, state, version=version)
        if finish != "more":
            break
    return Completion(
        # With tools, the text is what the trainer sees: every turn, stop strings included.
        text=state.text if tools is None else tools.decode(state.token_ids),
        token_ids=state.token_ids,
        logprobs=state.logprobs,
        finish_reason=finish,
        prompt_token_ids=list(prompt_ids),
        policy_version=version,
        token_versions=state.versions,
        loss_mask=state.mask if tools is not None else [],
        tool_stats={"turns": float(state.turns), **tools.stats()} if tools is not None else {},
    )


async def _tool_turn(tools: ToolSession, state: EpisodeState, *, version: int) -> str:
    """After a model turn ended on a stop: run its call and append the answer.

    Returns "more" (generate the next turn), or the episode's finish reason: "stop" (no call,
    or max_turns reached) or "length" (the answer filled the token budget).
    """
    turn_text = tools.decode(state.token_ids[state.turn_start :])
    reply = await tools.respond(turn_text) if state.turns < tools.max_turns else None
    if reply is None:
        return "stop"
    if reply.more:
        return "more"
    ids = tools.encode(reply.text)
    room = tools.max_tokens - len(state.token_ids)
    if len(ids) >= room:  # the answer leaves no room for a reply: keep what fits, stop
        state.append_tool(ids[:room], tools.decode(ids[:room]), version=version)
        return "length"
    state.append_tool(ids, reply.text, version=version)
    return "more"
