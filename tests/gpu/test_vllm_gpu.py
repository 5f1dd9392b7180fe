"""vLLM on a GPU with the NCCL update group (the CPU tests in tests/vllm use gloo).

Needs a vLLM env with CUDA: `RLVR_VLLM_PYTHON=/path/to/env/bin/python` (built by
`bash scripts/install-vllm.sh DIR` on a machine with internet access); skipped with that reason
otherwise. A push of perturbed bf16 weights over NCCL, then greedy ids and logprobs against a
transformers forward of the same weights on the GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.vllm.helpers import PROMPTS, forward_logprobs, generate, greedy, greedy_continuation
from tests.vllm.vllm_env import vllm_recipe

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda_vllm(tmp_path: Path):
    python = os.environ.get("RLVR_VLLM_PYTHON")
    if not python or not Path(python).exists():
        pytest.skip("set RLVR_VLLM_PYTHON to a vLLM env with CUDA (bash scripts/install-vllm.sh DIR)")
    from rlvr.process import free_port
    from tests.vllm.vllm_env import Server

    recipe = vllm_recipe(Path(python), "rollout.vllm.max_model_len=512", "rollout.vllm.dtype=float32",
                         "rollout.vllm.gpu_memory_utilization=0.2")  # fmt: skip
    server = Server(recipe, port=free_port(), log=tmp_path / "vllm.log", gpus=(0,))
    try:
        server.wait_healthy(600)
        yield server
    finally:
        server.stop()


def test_vllm_push_over_nccl_serves_the_pushed_weights(cuda_vllm) -> None:
    from rlvr.rollout.vllm import VLLMClient
    from rlvr.sync.broadcast import BroadcastSync
    from tests.vllm.helpers import reference_model

    model = reference_model(perturb_seed=3).cuda()
    sync = BroadcastSync(model, client=VLLMClient([cuda_vllm.url], timeout_s=300), timeout_s=300)
    try:
        metrics = sync.push(version=1)
    finally:
        sync.close()
    assert sync.backend == "nccl" and metrics["sync/engines"] == 1.0
    print(f"vLLM NCCL push: {metrics['sync/gb'] * 1e3:.1f} MB in {metrics['sync/transfer_seconds'] * 1e3:.1f} ms")
    model = model.cpu()
    for completion in generate(cuda_vllm.url, [greedy(p) for p in PROMPTS]):
        assert completion.token_ids == greedy_continuation(
            model, completion.prompt_token_ids, len(completion.token_ids)
        )
        ref = forward_logprobs(model, completion.prompt_token_ids, completion.token_ids)
        assert max(abs(a - b) for a, b in zip(ref, completion.logprobs, strict=True)) < 1e-3
        assert completion.policy_version == 1
    assert torch.cuda.is_available()
