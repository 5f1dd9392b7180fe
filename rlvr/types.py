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
means fewer than two of its samples could be judged (docs/rewards.md, "Verdicts")."""


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
    `own_text` is what the model itself wrote in a multi-turn episode, each of its turns decoded
    on its own, tool answers left out: rewards judge it, so a tool's output (a program's print, a
    search result) is never read as the model's answer (None: `text` is all the model's).
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
    own_text: str | None = None

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
    Whatever the model's output can bring about is a score, never a failure (docs/rewards.md, "Verdicts").
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


TOKEN_ROWS = ("prompts", "responses", "rollout_logprobs", "loss_masks")
"""RolloutBatch's per-token fields: rows of numbers, one per sequence."""


@dataclass
class RolloutBatch:
    """What every trainer rank needs from a step's rollouts: flat arrays, no torch, no per-token objects.

    `versions[i]` is the oldest weight version that sampled any token of sequence i: what a
    reader of the batch checks staleness against (the trainer needs no more: the loss's
    importance weight corrects for older weights token by token from the rollout log-probs).
    `loss_masks[i]` is one number for the whole response, or one per token when the response
    holds tool output (0 there).

    Two forms. While it is built, the per-token fields are rows: lists that `add_group` (or a
    test, appending to `batch.prompts` etc. of an empty batch) fills, holding the completions' own
    lists without copying them. `pack()` turns them into flat numpy arrays plus offsets
    (`arrays()`: token ids int32, logprobs and masks float32, per token; rewards, group ids,
    versions per sequence): the form that is broadcast to every rank as one buffer
    (`rlvr.trainer.dist.broadcast_rollout`) and laid out by `TrainBatch.from_rollout` without a
    per-token Python loop. At the flagship's shape (1024 samples, up to 4k tokens) rows of
    Python numbers are ~10^7 objects to pickle and rebuild on every rank; the arrays are a few
    memcpys. On a packed batch `prompts`, `responses`, `rollout_logprobs` and `loss_masks` are
    lists made on demand (tests, logging): reading them is not free, writing to them changes nothing.
    numpy is imported only when a batch is packed or read, so this module stays instant to import.
    """

    rewards: list[float] = field(default_factory=list)
    group_ids: list[int] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    _rows: dict[str, list[Any]] = field(default_factory=lambda: {name: [] for name in TOKEN_ROWS}, repr=False)
    _arrays: dict[str, Any] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.rewards)

    # -- rows (views once packed) -------------------------------------------------------------
    @property
    def prompts(self) -> list[list[int]]:
        return self._row_view("prompts")

    @property
    def responses(self) -> list[list[int]]:
        return self._row_view("responses")

    @property
    def rollout_logprobs(self) -> list[list[float]]:
        return self._row_view("rollout_logprobs")

    @property
    def loss_masks(self) -> list[float | list[float]]:
        return self._row_view("loss_masks")

    def _row_view(self, name: str) -> list[Any]:
        if self._arrays is None:
            return self._rows[name]
        a = self._arrays
        if name == "loss_masks":
            per_token = self._row_view_of(a["loss_mask"], a["response_offsets"])
            scalars = a["row_mask"].tolist()  # NaN: the row has one mask value per token
            return [row if m != m else m for row, m in zip(per_token, scalars, strict=True)]
        values, offsets = {
            "prompts": (a["prompt_ids"], a["prompt_offsets"]),
            "responses": (a["response_ids"], a["response_offsets"]),
            "rollout_logprobs": (a["logprobs"], a["response_offsets"]),
        }[name]
        return self._row_view_of(values, offsets)

    @staticmethod
    def _row_view_of(values: Any, offsets: Any) -> list[Any]:
        import numpy as np

        return [part.tolist() for part in np.split(values, offsets[1:-1])] if len(offsets) > 1 else []

    # -- building -------------------------------------------------------------------------------
    def add_group(self, group: Group, rewards: Sequence[float], masks: Sequence[float], group_id: int) -> None:
        if self._arrays is not None:
            raise RuntimeError("add_group on a packed RolloutBatch: add every group before pack()")
        rows = self._rows
        for completion, reward, mask in zip(group.completions, rewards, masks, strict=True):
            rows["prompts"].append(completion.prompt_token_ids)
            rows["responses"].append(completion.token_ids)
            rows["rollout_logprobs"].append(completion.logprobs)
            if completion.loss_mask:
                rows["loss_masks"].append([float(mask) * m for m in completion.loss_mask])
            else:
                rows["loss_masks"].append(float(mask))
            self.rewards.append(float(reward))
            self.group_ids.append(group_id)
            self.domains.append(group.sample.domain)
            self.versions.append(completion.oldest_version)

    def pack(self) -> RolloutBatch:
        """Rows -> flat arrays, in place (see the class docstring); returns the batch."""
        if self._arrays is None:
            self._arrays = self._pack_rows()
            self._rows = {name: [] for name in TOKEN_ROWS}
        return self

    def arrays(self) -> dict[str, Any]:
        """The flat numpy arrays (a row-form batch is packed into new ones each call, not in place):
        `prompt_ids`/`prompt_offsets`, `response_ids`/`response_offsets` (row i is
        `ids[offsets[i]:offsets[i + 1]]`), `logprobs` and `loss_mask` per response token,
        `row_mask` (a row's one loss-mask number, NaN where it has one per token), and `rewards`,
        `group_ids`, `versions` per sequence."""
        if self._arrays is not None:
            return self._arrays
        return self._pack_rows()

    @classmethod
    def from_arrays(cls, arrays: dict[str, Any], *, domains: Sequence[str]) -> RolloutBatch:
        """A packed batch from `arrays()`'s output (what a broadcast delivers)."""
        return cls(
            rewards=arrays["rewards"].tolist(),
            group_ids=arrays["group_ids"].tolist(),
            domains=list(domains),
            versions=arrays["versions"].tolist(),
            _arrays=dict(arrays),
        )

    def _pack_rows(self) -> dict[str, Any]:
        import numpy as np

        rows, n = self._rows, len(self.rewards)
        for name in TOKEN_ROWS:
            if len(rows[name]) != n:
                raise ValueError(f"RolloutBatch has {n} rewards but {len(rows[name])} rows of {name}")
        rlens = np.fromiter((len(r) for r in rows["responses"]), dtype=np.int64, count=n)
        response_offsets = row_offsets(rlens)
        row_mask = np.full(n, np.nan, dtype=np.float32)
        token_masks = []
        for i, (mask, rlen) in enumerate(zip(rows["loss_masks"], rlens.tolist(), strict=True)):
            if isinstance(mask, int | float):
                row_mask[i] = mask
            elif len(mask) != rlen:
                raise ValueError(f"row {i}: {len(mask)} loss-mask values for a {rlen}-token response")
            else:
                token_masks.append((i, mask))
        loss_mask = np.repeat(np.nan_to_num(row_mask, nan=0.0), rlens)
        for i, mask in token_masks:
            loss_mask[response_offsets[i] : response_offsets[i + 1]] = mask
        logprobs = flat_rows(rows["rollout_logprobs"], np.float32)
        if len(logprobs) != len(loss_mask) or any(
            len(lp) != rlen for lp, rlen in zip(rows["rollout_logprobs"], rlens.tolist(), strict=True)
        ):
            raise ValueError("every response needs one rollout logprob per token")
        return {
            "prompt_ids": flat_rows(rows["prompts"], np.int32),
            "prompt_offsets": row_offsets(np.fromiter((len(p) for p in rows["prompts"]), dtype=np.int64, count=n)),
            "response_ids": flat_rows(rows["responses"], np.int32),
            "response_offsets": response_offsets,
            "logprobs": logprobs,
            "loss_mask": loss_mask,
            "row_mask": row_mask,
            "rewards": np.asarray(self.rewards, dtype=np.float64).reshape(n),
            "group_ids": np.asarray(self.group_ids, dtype=np.int64).reshape(n),
            "versions": np.asarray(self.versions, dtype=np.int64).reshape(n),
        }

    @property
    def num_tokens(self) -> int:
        """Response tokens in the batch (what throughput counts)."""
        if self._arrays is not None:
            return int(self._arrays["response_offsets"][-1])
        return sum(len(r) for r in self._rows["responses"])


def row_offsets(lengths: Any) -> Any:
    import numpy as np

    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def flat_rows(rows: Sequence[Sequence[float]], dtype: Any) -> Any:
    """Rows of Python numbers -> one flat array, converted in C (no per-number Python step)."""
    import numpy as np

    parts = [np.asarray(row, dtype=dtype) for row in rows if len(row)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
