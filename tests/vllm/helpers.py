"""Shared pieces of the vLLM tests: a transformers reference of the served model, and pushes."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlvr.rollout.base import GenerateRequest, SamplingParams
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


def _server_counts(url: str) -> tuple[float, float]:
    """(requests running, generation tokens so far) from vLLM's Prometheus /metrics."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()

    def value(name: str) -> float:
        match = re.search(rf"^vllm:{name}{{[^}}]*}} (\S+)$", text, re.M)
        assert match, f"vLLM's /metrics has no {name}"
        return float(match.group(1))

    return value("num_requests_running"), value("generation_tokens_total")


def during_generation(
    url: str, action: Callable[[], Any], work: Callable[[], Any], *, min_tokens: int
) -> tuple[Any, bool]:
    """Run `work()` (generation) and `action()` (a push) once the server is running requests and has
    generated `min_tokens` of this work's tokens: a timer cannot say that, since the first prefill's
    start-up takes 0.2-2 s depending on the machine. Returns work's result and whether the action ran."""
    _, start = _server_counts(url)
    done: dict[str, Any] = {}

    def later() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "work" not in done:
            running, tokens = _server_counts(url)
            if running and tokens - start >= min_tokens:
                done["action"] = action()
                return
            time.sleep(0.05)  # each scrape costs the API process CPU that its output handling needs

    thread = threading.Thread(target=later)
    thread.start()
    done["work"] = work()
    thread.join()
    return done["work"], "action" in done


def push_mid_generation(
    url: str,
    *,
    reset: Callable[[], Any],
    push: Callable[[], Any],
    work: Callable[[], Any],
    min_tokens: int,
    landed: Callable[[Any], bool],
    tries: int = 5,
) -> Any:
    """`during_generation` from a fresh start (`reset()`: the base weights as version 0) until `landed`
    says the push met generation still running, at most `tries` times; returns that try's result.

    /metrics is the API process's view: when that process is starved (two cores, the worker busy on
    one), its output handling lags the engine, which may have produced its last token before the
    push's pause arrives, or before /metrics showed any. Such a try proves nothing either way, so it
    is run again; a push that never interrupts anything fails every try."""
    for _ in range(tries):
        reset()
        result, pushed = during_generation(url, push, work, min_tokens=min_tokens)
        if pushed and landed(result):
            return result
    raise AssertionError(f"in {tries} tries the push never landed while the server was still generating")
