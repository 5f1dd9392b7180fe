"""The currency every part of rlvr trades in: plain dataclasses, no torch.

Data produces `Sample`s, rollout turns them into `Completion`s, rewards turn a
(sample, completion) pair into a `RewardResult`, and the loop bundles one sample with
its n completions and rewards into a `Group`. Keeping these free of torch means the
recipe, data and reward layers (and `rlvr validate`) import in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CASE_TYPES = ("stdin_stdout", "assert", "pytest", "check_based", "text")


@dataclass(slots=True)
class Sample:
    """One prompt with what its reward needs to judge an answer.

    `messages` is the chat prompt (OpenAI format). `domain` is filled by the mixture
    (the recipe domain that owns `tag`). `ground_truth` serves math_rule and llm_judge;
    `test_cases` + `case_type` serve code_sandbox. Anything else in the row lands in
    `extra` so plug-in rewards can read their own fields.
    """

    id: str
    tag: str
    messages: list[dict[str, str]]
    domain: str = ""
    ground_truth: Any = None
    test_cases: Any = None
    case_type: str | None = None
    difficulty: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_text(self) -> str:
        """The last user message: what a reward or judge usually wants to show."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return message.get("content", "")
        return self.messages[-1].get("content", "") if self.messages else ""


@dataclass(slots=True)
class Completion:
    """One sampled response, with what the trainer needs to compute ratios.

    `logprobs[i]` is the sampling policy's log-probability of `token_ids[i]`.
    `policy_version` is the trainer step whose weights produced it, so the loop can
    bound staleness.
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"  # "stop" | "length" | "abort"
    prompt_token_ids: list[int] = field(default_factory=list)
    policy_version: int = 0


@dataclass(slots=True)
class RewardResult:
    """A score in the reward's range plus why (shown by `rlvr rewards check`)."""

    score: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Group:
    """One prompt with its n completions and their rewards (the GRPO group)."""

    sample: Sample
    completions: list[Completion]
    rewards: list[RewardResult] = field(default_factory=list)

    @property
    def scores(self) -> list[float]:
        return [r.score for r in self.rewards]
