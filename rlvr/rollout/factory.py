"""The rollout client a recipe's engine needs, and how a weight sync pauses it.

`rlvr serve` and SGLang speak SGLang's routes (`SGLangClient`); vLLM speaks its own
(`VLLMClient`). Both answer the same `RolloutClient` and weight-sync calls, so nothing above
this picks routes. `rlvr serve` gets `ServeClient`: SGLang's client plus the LoRA adapter push
(`load_lora_adapter`), which SGLang's servers do not take (they serve adapters by name, unmerged).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlvr.recipe.schema import RolloutConfig
from rlvr.rollout.sglang import SGLangClient

if TYPE_CHECKING:
    from rlvr.rollout.vllm import VLLMClient


SERVER_INFLIGHT = 1024
"""Samples in flight per SGLang or vLLM server (per data-parallel replica) when the recipe sets
none: above what one such server decodes at once at RL lengths (its batch is bounded by KV
memory, a few hundred multi-thousand-token sequences per GPU), so its scheduler always has
work queued, while a step's thousands of episodes do not all open sockets to it."""


def max_inflight_per_server(rollout: RolloutConfig) -> int:
    """`rollout.max_inflight_per_server`, else the engine's batch capacity with room to queue:
    2 x `max_batch` for `rlvr serve` (one batch decoding and one waiting, so a freed slot refills
    without a round trip), `SERVER_INFLIGHT` x dp replicas for SGLang and vLLM."""
    if rollout.max_inflight_per_server is not None:
        return rollout.max_inflight_per_server
    if rollout.engine == "embedded":
        return 2 * rollout.max_batch
    return SERVER_INFLIGHT * (rollout.sglang.dp_size if rollout.engine == "sglang" else 1)


class ServeClient(SGLangClient):
    """The client of `rlvr serve`: SGLang's routes, and rlvr's /merge_lora_adapter."""

    async def load_lora_adapter(self, path: str, *, version: int | None = None) -> None:
        """Every server serves its base weights plus this peft adapter folder (merged; it replaces
        the last adapter) and reports `version`; a bad folder raises, and the server keeps its
        weights and version. The path must be readable by the servers (the run's shared dir)."""
        payload: dict[str, Any] = {"lora_path": path}
        if version is not None:
            payload["weight_version"] = str(version)
        await self._broadcast("/merge_lora_adapter", payload)


def make_client(
    rollout: RolloutConfig,
    urls: Sequence[str],
    *,
    rejoin: bool = False,
    instances: Callable[[], Mapping[str, int]] | None = None,
    generation: int | None = None,
) -> SGLangClient | VLLMClient:
    """The client for `urls`. `rejoin`: the weight sync re-admits dead servers after a full push
    (`sync.on_engine_failure = "continue"`), so a dead or restarted server is held until then and
    a group waits up to `rollout.server_wait_s` for a live one; `instances`: the servers' start
    counts (`rlvr.rendezvous.server_instances`), how a restart on the same URL is told apart.
    `generation`: the trainer start's (`rlvr.rundir.trainer_generation`), sent with every call, so
    `rlvr serve` refuses the pushes of an older trainer once it has seen a newer one."""
    common: dict[str, Any] = {
        "api_key": rollout.api_key,
        "timeout_s": rollout.timeout_s,
        "max_inflight_per_server": max_inflight_per_server(rollout),
        "hold_dead": rejoin,
        "wait_s": rollout.server_wait_s if rejoin else 0.0,
        "instances": instances,
        "generation": generation,
    }
    if rollout.engine == "vllm":
        from rlvr.rollout.vllm import VLLMClient

        return VLLMClient(urls, **common)
    kind = ServeClient if rollout.engine == "embedded" else SGLangClient
    return kind(urls, **common)


def sync_pause_mode(rollout: RolloutConfig) -> str:
    """How a push pauses the engines. vLLM with `partial`: `in_place` (vLLM's keep: in-flight
    samples freeze, are prefilled again under the new weights and go on, each token tagged by
    vLLM); else `abort` (the episode continues or restarts what came back, `rollout.partial`)."""
    return "in_place" if rollout.engine == "vllm" and rollout.partial else "abort"
