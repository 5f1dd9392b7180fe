"""The real vLLM (CPU build) takes a LoRA adapter push through rlvr's backend: base + adapter, merged.

No `--enable-lora`: the backend merges the adapter into the base (`rlvr.server.lora_merge`) and
reloads only the layers it touches (with their fused siblings), under the pushed version.
The reference is transformers + peft (the unmerged adapter), as for `rlvr serve`
(tests/integration/test_serve_lora.py, whose helpers these are).
"""

from __future__ import annotations

import asyncio

import pytest

from rlvr.rollout.base import RolloutError
from rlvr.rollout.vllm import VLLMClient
from tests.integration.test_serve_lora import (
    PROMPTS,
    assert_refused_in_one_line,
    assert_serves,
    broken_copies,
    greedy,
    greedy_continuation,
    peft_reference,
)
from tests.unit.rollout.test_lora_merge import two_adapters

from .helpers import generate, push, reference_model

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    return two_adapters(tmp_path_factory.mktemp("vllm-lora"))


@pytest.fixture
def base(vllm_server):
    """The server on the base weights as version 0, and back on them afterwards (other tests expect them)."""
    model = reference_model()
    push(vllm_server.url, model, version=0)
    yield model
    push(vllm_server.url, model, version=0)


def load(url: str, adapter, version: int) -> None:
    async def go():
        async with VLLMClient([url], timeout_s=120, max_retries=0) as client:
            await client.load_lora_adapter(str(adapter), version=version)

    asyncio.run(go())


def served(url: str) -> list:
    return generate(url, [greedy(p) for p in PROMPTS])


def test_serves_the_base_plus_the_adapter_under_its_version(vllm_server, base, adapters) -> None:
    load(vllm_server.url, adapters["qvd"], 1)
    completions = served(vllm_server.url)
    assert_serves(completions, peft_reference(adapters["qvd"]), version=1)
    assert all(set(c.token_versions) == {1} for c in completions)
    assert [c.token_ids for c in completions] != [greedy_continuation(base, p, 24) for p in PROMPTS]


def test_a_second_adapter_replaces_the_first(vllm_server, base, adapters) -> None:
    """`oq` after `qvd`: q_proj is `oq`'s alone, v_proj and down_proj are the base's again."""
    load(vllm_server.url, adapters["qvd"], 2)
    load(vllm_server.url, adapters["oq"], 3)
    assert_serves(served(vllm_server.url), peft_reference(adapters["oq"]), version=3)


def test_a_broken_folder_fails_in_one_line_and_keeps_weights_and_version(vllm_server, base, adapters, tmp_path) -> None:
    load(vllm_server.url, adapters["oq"], 4)
    for folder, parts in broken_copies(adapters["qvd"], tmp_path):
        with pytest.raises(RolloutError) as info:
            load(vllm_server.url, folder, 5)
        assert_refused_in_one_line(info.value, folder, parts)
    # Still the last good adapter, under its version (the backend closed the reload it had opened),
    # and the server still takes adapters.
    assert_serves(served(vllm_server.url), peft_reference(adapters["oq"]), version=4)
    load(vllm_server.url, adapters["qvd"], 6)
    assert_serves(served(vllm_server.url), peft_reference(adapters["qvd"]), version=6)
