"""`rlvr serve` takes a LoRA adapter push: it serves the base plus the adapter, merged, under the pushed version.

One real `rlvr serve` process on the quickstart policy (Qwen3, tied embeddings, 3 layers), driven
through `ServeClient` as the trainer's adapter sync drives it. The reference is transformers +
peft: the unmerged peft model's greedy tokens and log-probs.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr.rollout.base import GenerateRequest, RolloutError
from rlvr.rollout.factory import ServeClient
from tests.conftest import embedded_server

# The transformers reference and the adapter folders are the vLLM tests' and the merge tests' own.
from tests.unit.rollout.test_lora_merge import two_adapters
from tests.vllm.helpers import LOGPROB_TOL, POLICY, PROMPTS, forward_logprobs, greedy, greedy_continuation


@functools.cache
def peft_reference(adapter: Path | None) -> Any:
    """transformers' base model with the adapter applied by peft (not merged); None: the base."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(POLICY, dtype=torch.float32).eval()
    return base if adapter is None else PeftModel.from_pretrained(base, adapter).eval()


def assert_serves(completions: list, model: Any, *, version: int) -> None:
    """Greedy ids *and* their log-probs equal the reference's (ids alone can match by luck)."""
    for completion in completions:
        prompt = completion.prompt_token_ids
        assert completion.token_ids == greedy_continuation(model, prompt, len(completion.token_ids))
        ref = forward_logprobs(model, prompt, completion.token_ids)
        assert max(abs(a - b) for a, b in zip(ref, completion.logprobs, strict=True)) < LOGPROB_TOL
        assert completion.policy_version == version


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    return two_adapters(tmp_path_factory.mktemp("serve-lora"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-lora-log") / "server.log"
    with embedded_server(POLICY, log=log, max_batch=8, max_seq_len=256) as url:
        yield url


async def _generate(url: str, requests: list[GenerateRequest]) -> list:
    async with ServeClient([url], timeout_s=60) as client:
        return await client.generate(requests)


async def _load(url: str, adapter: Path, version: int) -> None:
    async with ServeClient([url], timeout_s=60, max_retries=0) as client:
        await client.load_lora_adapter(str(adapter), version=version)


async def test_serves_the_base_plus_the_adapter_under_its_version(server, adapters) -> None:
    requests = [greedy(p) for p in PROMPTS]
    await _load(server, adapters["qvd"], 1)
    served = await _generate(server, requests)
    assert_serves(served, peft_reference(adapters["qvd"]), version=1)
    base = peft_reference(None)
    assert [c.token_ids for c in served] != [greedy_continuation(base, p, 24) for p in PROMPTS]  # it changed


async def test_a_second_adapter_replaces_the_first(server, adapters) -> None:
    await _load(server, adapters["qvd"], 2)
    await _load(server, adapters["oq"], 3)
    assert_serves(await _generate(server, [greedy(p) for p in PROMPTS]), peft_reference(adapters["oq"]), version=3)


def broken_copies(good: Path, root: Path) -> list[tuple[Path, list[str]]]:
    """Two broken copies of an adapter folder (a missing file, a wrong shape), each with the parts
    its one-line refusal must hold."""
    from safetensors.torch import load_file, save_file

    missing, wrong = root / "missing-file", root / "wrong-shape"
    shutil.copytree(good, missing)
    shutil.copytree(good, wrong)
    (missing / "adapter_model.safetensors").unlink()
    tensors = load_file(str(wrong / "adapter_model.safetensors"))
    tensors["base_model.model.model.layers.2.mlp.down_proj.lora_B.weight"] = torch.zeros(64, 4)
    save_file(tensors, str(wrong / "adapter_model.safetensors"))
    return [
        (missing, ["adapter_model.safetensors in ", ": missing (a peft adapter folder holds"]),
        (wrong, ["layers.2.mlp.down_proj.lora_B.weight has shape [64, 4], expected [128, 4]"]),
    ]


def assert_refused_in_one_line(error: BaseException, folder: Path, parts: list[str]) -> None:
    message = str(error)
    assert "\n" not in message and str(folder) in message and all(p in message for p in parts), message


async def test_a_broken_folder_fails_in_one_line_and_keeps_weights_and_version(server, adapters, tmp_path) -> None:
    await _load(server, adapters["oq"], 4)
    for folder, parts in broken_copies(adapters["qvd"], tmp_path):
        with pytest.raises(RolloutError) as info:
            await _load(server, folder, 5)
        assert_refused_in_one_line(info.value, folder, parts)
    # Still the last good adapter, under its version; and it still takes adapters.
    assert_serves(await _generate(server, [greedy(p) for p in PROMPTS]), peft_reference(adapters["oq"]), version=4)
    await _load(server, adapters["qvd"], 6)
    assert_serves(await _generate(server, [greedy(p) for p in PROMPTS]), peft_reference(adapters["qvd"]), version=6)
