"""The rollout contract: what the loop and the weight sync may ask of any generation engine.

Three engines implement it: `EmbeddedEngine` (torch, in-process, any machine), `SGLangClient`
(HTTP to SGLang servers or to `rlvr serve`, which speaks the same routes) and `VLLMClient`.
The loop only sees this Protocol, so a CPU laptop run and a multi-node SGLang run share
every line above the rollout layer.

No torch here: the launcher and `rlvr validate` import this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from rlvr.types import Completion

EMBEDDED_ENGINE = "rlvr-embedded"
"""`/server_info`'s "engine" for `rlvr serve` (`sync.verify` auto verifies the engines that say it)."""

PauseMode = Literal["abort", "retract", "in_place"]


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling settings, named as in SGLang's `sampling_params`.

    `temperature = 0` is greedy (SGLang turns it into top_k = 1 at temperature 1, so the
    reported logprobs are then those of the raw logits). `top_k = -1` keeps every token.
    `seed` makes a request reproducible: sample j of a request with n samples uses
    seed + j, so the n samples differ from each other but not from run to run.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-6 or self.top_k == 1

    def to_sglang(self) -> dict[str, Any]:
        """The `sampling_params` dict of SGLang's /generate (`seed` travels as `sampling_seed`)."""
        out: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "max_new_tokens": self.max_new_tokens,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
        }
        if self.stop:
            out["stop"] = list(self.stop)
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            out["sampling_seed"] = self.seed
        return out

    @classmethod
    def from_sglang(cls, params: dict[str, Any] | None) -> SamplingParams:
        """Parse SGLang's `sampling_params` (unknown keys are ignored, as SGLang mostly does)."""
        params = dict(params or {})
        stop = params.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        seed = params.get("sampling_seed", params.get("seed"))
        return cls(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1)),
            min_p=float(params.get("min_p", 0.0)),
            max_new_tokens=int(params.get("max_new_tokens", 128)),
            stop=list(stop),
            stop_token_ids=[int(t) for t in params.get("stop_token_ids") or []],
            ignore_eos=bool(params.get("ignore_eos", False)),
            skip_special_tokens=bool(params.get("skip_special_tokens", True)),
            seed=None if seed is None else int(seed),
        )


@dataclass(slots=True)
class GenerateRequest:
    """One prompt (token ids) and how many completions to sample for it (the GRPO group size).

    `affinity`: requests with the same key go to the same server while it is live (one GRPO
    group's n-sample request and its samples' continuations), so the prompt's KV is reused
    there; an HTTP client routes by it (`rlvr.rollout.pool`), an in-process engine ignores it.
    """

    input_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    rid: str | None = None
    affinity: str | None = None


class RolloutError(RuntimeError):
    """Generation failed for good: every server is dead, or retries ran out."""


@runtime_checkable
class RolloutClient(Protocol):
    """What the RL loop and the weight sync need from a generation backend.

    `generate` returns a flat list: request i's n completions are contiguous and in
    order (as SGLang orders a batched request with n > 1). Each completion carries the
    token ids, the per-token logprobs of the sampling distribution, and the weight
    version that produced it.
    """

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]: ...

    async def pause(self, mode: PauseMode = "abort") -> None:
        """Stop generating. abort: in-flight requests return with finish_reason "abort";
        retract: they go back to the queue and restart (from prompt + tokens so far) on resume;
        in_place: they wait with their KV cache. Requests issued while paused wait for resume."""
        ...

    async def resume(self) -> None: ...

    async def update_weights_from_disk(self, path: str, *, version: int | None = None) -> None:
        """Load a HF safetensors folder of the same architecture; `version` becomes the policy version."""
        ...

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
    ) -> None:
        """Join the trainer's broadcast group (trainer rank 0 is rank 0 of the group)."""
        ...

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str = "weight_update_group",
        version: int | None = None,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> None:
        """Receive one bucket of tensors broadcast from group rank 0, in `names` order, and load them.

        `load_format=None`: one broadcast per tensor; `"flattened_bucket"` (SGLang's name): one
        uint8 broadcast of the tensors' bytes back to back, in `names` order.
        """
        ...

    async def health(self) -> bool: ...


def parse_version(value: Any) -> int:
    """SGLang's weight_version is a string; rlvr's policy_version an int (-1 when not numeric)."""
    if value is None:
        return 0
    try:
        return int(str(value))
    except ValueError:
        return -1
