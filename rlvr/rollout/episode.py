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

The same function will grow tool turns (generate -> tool -> generate): each turn's input is
the previous ids plus the new ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rlvr.rollout.engine import GenerateRequest, RolloutEngine, RolloutError, SamplingParams
from rlvr.types import Completion

# Each weight update an episode spans aborts it once; far more means an engine aborts in a loop.
MAX_ABORTS = 64


async def _no_wait() -> None:
    return None


@dataclass(slots=True)
class EpisodeState:
    """What an episode has produced so far (kept across aborts when partial)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    text: str = ""
    aborts: int = 0

    def extend(self, part: Completion) -> None:
        self.token_ids += part.token_ids
        self.logprobs += part.logprobs
        self.versions += [part.policy_version] * len(part.token_ids)
        self.text += part.text

    def reset(self) -> None:
        self.token_ids, self.logprobs, self.versions, self.text = [], [], [], ""


async def run_episode(
    engine: RolloutEngine,
    *,
    prompt_ids: list[int],
    params: SamplingParams,
    partial: bool,
    weights_ready: Callable[[], Awaitable[object]] = _no_wait,
) -> Completion:
    """Generate one response to `prompt_ids`, continuing across aborts (see the module docstring).

    `weights_ready` is awaited before every request: the rollout manager closes it while a
    weight update runs, so a resend never reaches a paused engine mid-update.
    """
    state = EpisodeState()
    finish, version = "length", 0
    while True:
        budget = params.max_new_tokens - len(state.token_ids)
        if budget <= 0:
            finish = "length"
            break
        await weights_ready()
        # Same seed after an abort would replay the first draws on new positions; shift it.
        seed = None if params.seed is None else params.seed + 1_000_003 * state.aborts
        request = GenerateRequest(
            input_ids=prompt_ids + state.token_ids,
            params=dataclasses.replace(params, max_new_tokens=budget, seed=seed),
            n=1,
        )
        (part,) = await engine.generate([request])
        version = part.policy_version
        if part.finish_reason != "abort":
            state.extend(part)
            finish = part.finish_reason
            break
        state.aborts += 1
        if state.aborts > MAX_ABORTS:
            raise RolloutError(f"a generation was aborted {state.aborts} times in a row")
        if partial:
            state.extend(part)
        else:
            state.reset()
    return Completion(
        text=state.text,
        token_ids=state.token_ids,
        logprobs=state.logprobs,
        finish_reason=finish,
        prompt_token_ids=list(prompt_ids),
        policy_version=version,
        token_versions=state.versions,
    )
