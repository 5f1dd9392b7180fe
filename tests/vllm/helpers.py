"""Shared pieces of the vLLM tests: a transformers reference of the served model, and pushes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

from rlvr.rollout.engine import GenerateRequest, SamplingParams
from rlvr.rollout.vllm import VLLMClient

from .vllm_env import ROOT

POLICY = ROOT / "recipes" / "quickstart" / "policy"
PROMPTS = [[2, 10, 11, 12, 13], [2, 40, 41, 7], [2, 60, 5, 5, 9, 3], [2, 88]]
LOGPROB_TOL = 1e-4  # fp32 on both sides; measured differences are ~1e-5


def reference_model(perturb_seed: int | None = None) -> Any:
    """The quickstart policy in transformers, optionally with every weight nudged (seeded)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(POLICY, dtype=torch.float32).eval()
    if perturb_seed is not None:
        gen = torch.Generator().manual_seed(perturb_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def forward_logprobs(model: Any, prompt: list[int], ids: list[int], *, temperature: float = 1.0) -> list[float]:
    """log-softmax(logits / T) of each of `ids` after `prompt` (what the trainer's forward computes)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()


def greedy_continuation(model: Any, prefix: list[int], count: int) -> list[int]:
    """transformers' greedy tokens after `prefix` (no EOS stop: the servers run with ignore_eos)."""
    ids = list(prefix)
    with torch.no_grad():
        for _ in range(count):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prefix) :]


def generate(url: str, requests: list[GenerateRequest]) -> list:
    async def go():
        async with VLLMClient([url]) as client:
            return await client.generate(requests)

    return asyncio.run(go())


def greedy(prompt: list[int], tokens: int = 24) -> GenerateRequest:
    return GenerateRequest(prompt, SamplingParams(temperature=0, max_new_tokens=tokens, ignore_eos=True))


def push(url: str, model: Any, *, version: int, method: str = "broadcast", shared: Path | None = None) -> dict:
    """Push `model`'s weights to the server as rlvr's trainer does (BroadcastSync or DiskSync)."""
    client = VLLMClient([url], timeout_s=120)
    if method == "broadcast":
        from rlvr.sync.broadcast import BroadcastSync

        sync: Any = BroadcastSync(model, client=client, timeout_s=120, pause_mode="in_place")
    else:
        from rlvr.sync.disk import DiskSync

        assert shared is not None
        sync = DiskSync(model, client=client, shared_dir=shared, timeout_s=120, pause_mode="in_place")
    try:
        return sync.push(version=version)
    finally:
        sync.close()
