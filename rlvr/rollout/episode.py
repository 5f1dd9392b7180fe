"""One sample's episode: token in, token out, surviving weight updates.

An episode sends `prompt + tokens so far` and appends what comes back, never re-tokenising, so
the trainer sees exactly the ids the engine sampled. When a weight push aborts a request, the
episode keeps its tokens (each tagged with the version that sampled it) and continues under the new
weights (`partial = True`), or restarts from the prompt. With `tools` it has turns: a tool's answer
is appended as tokens (loss mask 0), and a turn that ends on EOS ends the episode, unless the EOS
comes right after a whole call no stop string can end (a closing code fence, then EOS). A group
(`run_group`) starts as one n-sample request (sample j seeded seed + j) under one affinity key, so
its prompt is prefilled once, on one server; a sample goes on alone only when it must, and samples
what its own episode would have. Text is decoded from all of a response's ids at once and stop
strings are checked across request seams, so an abort never changes the response (docs/async.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlvr.rollout.base import GenerateRequest, RolloutClient, RolloutError, SamplingParams
from rlvr.types import Completion

# Each weight update an episode spans aborts it once; far more means an engine aborts in a loop.
MAX_ABORTS = 64

_GROUP_KEYS = itertools.count()  # affinity keys: unique per process, which is all a client needs


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

    def ends_with_call(self, text: str) -> bool:
        """The turn's text ends on a whole call (run or answered with its error), not an unfinished one."""
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
    # Stop strings are searched from `scope`: the start of the requests since the last one that
    # ended normally. `seam`: where the first continuation (after an abort) began in that stretch;
    # None while it is one request's output, which its engine has already checked.
    scope: int = 0
    seam: int | None = None

    def extend(self, part: Completion) -> None:
        if part.token_ids and self.seam is None and len(self.token_ids) > self.scope:
            self.seam = len(self.token_ids)
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
        self.next_scope()

    def next_scope(self) -> None:
        """The requests so far ended normally: later stop strings are searched after them."""
        self.scope, self.seam = len(self.token_ids), None

    def truncate(self, end: int) -> None:
        """Keep the first `end` ids; every per-token list stays aligned (`text` is recomputed)."""
        del self.token_ids[end:], self.logprobs[end:], self.versions[end:], self.mask[end:]

    def reset(self) -> None:
        self.token_ids, self.logprobs, self.versions, self.mask, self.text = [], [], [], [], ""
        self.turns, self.turn_start, self.scope, self.seam = 1, 0, 0, None


async def run_episode(
    engine: RolloutClient,
    *,
    prompt_ids: list[int],
    params: SamplingParams,
    partial: bool,
    weights_ready: Callable[[], Awaitable[object]] = _no_wait,
    tools: ToolSession | None = None,
    tokenizer: Any = None,
    affinity: str | None = None,
    first: Completion | None = None,
) -> Completion:
    """Generate one response to `prompt_ids`, continuing across aborts (see the module docstring).

    `weights_ready` is awaited before every request: the rollout manager closes it while a
    weight update runs, so a resend never reaches a paused engine mid-update. With `tools`
    the token budget is the session's (model and tool tokens together) and
    `params.max_new_tokens` is unused. `tokenizer` (anything with HF's
    `decode(ids, skip_special_tokens=...)`) decodes a response made by several requests.
    `affinity` travels on every request (`GenerateRequest.affinity`). `first`: the answer to
    this episode's first request, already made (by `run_group`'s n-sample request, with this
    episode's params and seed): the episode takes it as its first part and goes on from there.
    """
    state = EpisodeState()
    limit = params.max_new_tokens if tools is None else tools.max_tokens
    stop = list(params.stop) if tools is None else [*params.stop, *tools.stop]
    decode = _decoder(tokenizer, engine, tools, skip_special_tokens=params.skip_special_tokens)
    finish, version = "length", 0
    on_stop_string = False  # the last request chain ended on one of `stop` (not on EOS or length)
    while True:
        budget = limit - len(state.token_ids)
        if budget <= 0:
            finish = "length"
            break
        if first is not None and state.requests == 0:
            part = first
            state.requests += 1
        else:
            await weights_ready()
            # The same seed on a later request would replay the first draws on new positions; shift it.
            seed = None if params.seed is None else params.seed + 1_000_003 * state.requests
            state.requests += 1
            request = GenerateRequest(
                input_ids=prompt_ids + state.token_ids,
                params=dataclasses.replace(params, max_new_tokens=budget, seed=seed, stop=stop),
                n=1,
                affinity=affinity,
            )
            (part,) = await engine.generate([request])
        version = part.policy_version
        finish = part.finish_reason
        if finish == "abort":
            state.aborts += 1
            if state.aborts > MAX_ABORTS:
                raise RolloutError(f"a generation was aborted {state.aborts} times in a row")
            if not partial:
                state.reset()
                if tools is not None:
                    tools.reset()
                continue
        state.extend(part)
        # Which stop ended the chain: needed when it spans a seam (a stop string may straddle it)
        # and for a tool turn (EOS ends the episode, a call's stop string runs the call).
        on_stop_string = False
        if decode is not None and stop and (state.seam is not None or (tools is not None and finish == "stop")):
            end = first_stop(decode, state.token_ids, stop, start=state.scope, after=state.seam or state.scope)
            if end is not None:
                state.truncate(end)
                finish, on_stop_string = "stop", True
        if finish == "abort":
            continue
        if tools is None or finish != "stop" or len(state.token_ids) <= state.scope:
            break
        if not on_stop_string and not _call_before_eos(tools, state):
            break  # EOS (or a stop token id): the model ended its turn, and so the episode
        finish = await _tool_turn(tools, state, version=version)
        if finish != "more":
            break
        state.next_scope()
    own_text = None
    if tools is not None:  # the text is what the trainer sees: every turn, stop strings included
        text = tools.decode(state.token_ids)
        own_text = "\n".join(tools.decode(turn) for turn in model_turns(state.token_ids, state.mask))
    elif state.seam is None or decode is None:  # one request made the response: its engine's text
        text = state.text
    else:
        text = decode(state.token_ids)
        if on_stop_string:  # as engines do: the text ends before the stop string
            text = text[: min((text.find(s) for s in stop if s and s in text), default=len(text))]
    return Completion(
        text=text,
        token_ids=state.token_ids,
        logprobs=state.logprobs,
        finish_reason=finish,
        prompt_token_ids=list(prompt_ids),
        policy_version=version,
        token_versions=state.versions,
        loss_mask=state.mask if tools is not None else [],
        tool_stats={"turns": float(state.turns), **tools.stats()} if tools is not None else {},
        own_text=own_text,
    )


def model_turns(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of ids the model sampled (mask 1), in order: its turns without the tool answers."""
    turns: list[list[int]] = []
    for i, (token, own) in enumerate(zip(ids, mask, strict=True)):
        if own:
            if i == 0 or not mask[i - 1]:
                turns.append([])
            turns[-1].append(token)
    return turns


async def run_group(
    engine: RolloutClient,
    *,
    prompt_ids: list[int],
    params: SamplingParams,
    n: int,
    partial: bool,
    weights_ready: Callable[[], Awaitable[object]] = _no_wait,
    tools: Sequence[ToolSession] | None = None,
    tokenizer: Any = None,
) -> list[Completion]:
    """The n responses of one group, in sample order; sample j is seeded `params.seed + j`.

    Every request carries the group's affinity key (one server). Without `tools`, one n-sample
    request starts all n samples (one prefill), and only a sample that came back aborted sends
    requests of its own; with `tools` (one session per sample), n episodes run side by side.
    See the module docstring; the other arguments are `run_episode`'s.
    """
    if tools is not None and len(tools) != n:
        raise ValueError(f"a group of {n} samples needs {n} tool sessions, got {len(tools)}")
    affinity = f"group-{next(_GROUP_KEYS)}"

    def seeded(j: int) -> SamplingParams:
        return params if params.seed is None else dataclasses.replace(params, seed=params.seed + j)

    def episode(j: int, first: Completion | None = None) -> Awaitable[Completion]:
        return run_episode(
            engine,
            prompt_ids=prompt_ids,
            params=seeded(j),
            partial=partial,
            weights_ready=weights_ready,
            tools=tools[j] if tools is not None else None,
            tokenizer=tokenizer,
            affinity=affinity,
            first=first,
        )

    if tools is not None or n == 1 or params.max_new_tokens <= 0:
        return list(await asyncio.gather(*(episode(j) for j in range(n))))
    await weights_ready()
    # Exactly each episode's own first request (run_episode: seed + j, the whole budget), for all n at once.
    request = GenerateRequest(input_ids=list(prompt_ids), params=params, n=n, affinity=affinity)
    firsts = await engine.generate([request])
    if len(firsts) != n:
        raise RolloutError(f"asked for {n} samples of one prompt, got {len(firsts)}")
    return list(await asyncio.gather(*(episode(j, first) for j, first in enumerate(firsts))))


def _decoder(
    tokenizer: Any, engine: object, tools: ToolSession | None, *, skip_special_tokens: bool
) -> Callable[[Sequence[int]], str] | None:
    """How this episode decodes ids: the given tokenizer, else the engine's, else the session's."""
    source = next(
        (t for t in (tokenizer, getattr(engine, "tokenizer", None)) if callable(getattr(t, "decode", None))), None
    )
    if source is None:
        return tools.decode if tools is not None else None

    def decode(ids: Sequence[int]) -> str:
        return source.decode(list(ids), skip_special_tokens=skip_special_tokens)

    return decode


def first_stop(
    decode: Callable[[Sequence[int]], str], ids: Sequence[int], stop: Sequence[str], *, start: int, after: int
) -> int | None:
    """The end of the shortest prefix of `ids[start:]` whose text holds a stop string (an index
    into `ids`: the ids to keep are `ids[:end]`), or None when the text holds none.

    `ids[start:after]` is known to hold none (one request's output its engine checked). Text only
    grows as ids are added, so the first hit is found by bisection: a few decodes, not one per id.
    """
    stops = [s for s in stop if s]

    def hit(end: int) -> bool:
        text = decode(ids[start:end])
        return any(s in text for s in stops)

    lo, hi = max(after, start), len(ids)
    if hi <= lo or not hit(hi):
        return None
    if hi - 1 <= lo or not hit(hi - 1):  # the common case: the last id completed it
        return hi
    hi -= 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if hit(mid) else (mid, hi)
    return hi


def _call_before_eos(tools: ToolSession, state: EpisodeState) -> bool:
    """The turn ended on EOS right after a whole call (a closing fence, which no stop string can end:
    the model writes ```` ``` ```` then EOS, as SmolLM2 does): the EOS is cut, as if a stop string had
    ended the turn there, and the call runs. Anything else before an EOS (an opened fence, a quoted call)
    ends the episode: the model is never asked to write past its own EOS."""
    turn = state.token_ids[state.turn_start :]
    if not turn or not tools.ends_with_call(tools.decode(turn)):
        return False
    if tools.decode(turn[-1:]) == "":  # a special token, as EOS is: not part of the call
        state.truncate(len(state.token_ids) - 1)
    return True


async def _tool_turn(tools: ToolSession, state: EpisodeState, *, version: int) -> str:
    """After a model turn ended on a stop string: run its call and append the answer.

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
