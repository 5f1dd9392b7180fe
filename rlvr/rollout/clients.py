"""The rollout client a recipe's engine needs, and how a weight sync pauses it.

`rlvr serve` and SGLang speak SGLang's routes (`SGLangClient`); vLLM speaks its own
(`VLLMClient`). Both answer the same `RolloutEngine` and weight-sync calls, so nothing above
this picks routes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlvr.recipe.schema import RolloutConfig

if TYPE_CHECKING:
    from rlvr.rollout.sglang import SGLangClient
    from rlvr.rollout.vllm import VLLMClient


def make_client(rollout: RolloutConfig, urls: Sequence[str]) -> SGLangClient | VLLMClient:
    if rollout.engine == "vllm":
        from rlvr.rollout.vllm import VLLMClient

        return VLLMClient(urls, api_key=rollout.api_key, timeout_s=rollout.timeout_s)
    from rlvr.rollout.sglang import SGLangClient

    return SGLangClient(urls, api_key=rollout.api_key, timeout_s=rollout.timeout_s)


def sync_pause_mode(rollout: RolloutConfig) -> str:
    """How a push pauses the engines. vLLM with `partial`: `in_place` (vLLM's keep: in-flight
    samples freeze, are prefilled again under the new weights and go on, each token tagged by
    vLLM); else `abort` (the episode continues or restarts what came back, `rollout.partial`)."""
    return "in_place" if rollout.engine == "vllm" and rollout.partial else "abort"
