"""The currency every part of rlvr trades in: plain dataclasses, no torch.

Data produces `Sample`s, rollout turns them into `Completion`s, rewards turn a
(sample, completion) pair into a `RewardResult`, and the loop bundles one sample with
its n completions and rewards into a `Group`. Keeping these free of torch means the
recipe, data and reward layers (and `rlvr validate`) import in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CASE_TYPES = ("stdin_stdout", "assert", "pytest", "check_based", "text")
GROUP_ENDS = ("trained", "stale", "filtered", "failed", "cancelled")
"""How every group the rollout manager starts ends, exactly once (`groups/<end>` metrics): failed
means fewer than two of its samples could be judged (README "Verdicts")."""


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
    bound staleness. A partial rollout (interrupted by a weight update, then continued)
    spans versions: `token_versions[i]` is the version that sampled token i (empty: every
    token is `policy_version`). A multi-turn episode interleaves the model's tokens with tool
    output: `loss_mask[i]` is 1 for a token the model sampled and 0 for one a tool wrote (its
    logprob is 0 and it counts 0 in the loss); empty means every token is the model's.
    `tool_stats` holds the episode's turns, tool calls, errors, timeouts and tool seconds.
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"  # "stop" | "length" | "abort"
    prompt_token_ids: list[int] = field(default_factory=list)
    policy_version: int = 0
    token_versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    tool_stats: dict[str, float] = field(default_factory=dict)

    @property
    def oldest_version(self) -> int:
        """The staleness that counts: the oldest weights that produced any of its tokens."""
        return min(self.token_versions) if self.token_versions else self.policy_version


@dataclass(slots=True)
class RewardResult:
    """A verdict: a score in the reward's range plus why, or *failed*: the reward could not judge.

    `failed` holds the cause ("judge unreachable: ...", "RuntimeError: ...") when something
    outside the sample kept the reward from judging it: a service down, a sandbox that could not
    start, the reward's own exception or deadline. A failed sample is never trained on (a 0 would
    teach the policy that a right answer was wrong); it is counted in `reward/<domain>/failed`.
    Whatever the model's output can bring about is a score, never a failure (README "Verdicts").
    """

    score: float
    info: dict[str, Any] = field(default_factory=dict)
    failed: str | None = None

    @property
    def judged(self) -> bool:
        return self.failed is None


@dataclass(slots=True)
class Group:
    """One prompt with its n completions and their rewards (the GRPO group)."""

    sample: Sample
    completions: list[Completion]
    rewards: list[RewardResult] = field(default_factory=list)

    @property
    def scores(self) -> list[float]:
        return [r.score for r in self.rewards]


@dataclass
class RolloutBatch:
    """What every trainer rank needs from a step's rollouts (picklable, no torch).

    `versions[i]` is the oldest weight version that sampled any token of sequence i: the
    trainer recomputes pi_old when one is older than its own weights (off-policy correction).
    `loss_masks[i]` is one number for the whole response, or one per token when the response
    holds tool output (0 there): `TrainBatch.from_sequences` takes either.
    """

    prompts: list[list[int]] = field(default_factory=list)
    responses: list[list[int]] = field(default_factory=list)
    rollout_logprobs: list[list[float]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    loss_masks: list[float | list[float]] = field(default_factory=list)
    group_ids: list[int] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.responses)

    def add_group(self, group: Group, rewards: Sequence[float], masks: Sequence[float], group_id: int) -> None:
        for completion, reward, mask in zip(group.completions, rewards, masks, strict=True):
            self.prompts.append(list(completion.prompt_token_ids))
            self.responses.append(list(completion.token_ids))
            self.rollout_logprobs.append(list(completion.logprobs))
            self.rewards.append(float(reward))
            if completion.loss_mask:
                self.loss_masks.append([float(mask) * m for m in completion.loss_mask])
            else:
                self.loss_masks.append(float(mask))
            self.group_ids.append(group_id)
            self.domains.append(group.sample.domain)
            self.versions.append(completion.oldest_version)

    def stale(self, version: int) -> bool:
        """Whether any sequence was (partly) sampled by weights older than `version`."""
        return any(v < version for v in self.versions)
