"""Rank 0's overhead at a 7B recipe's batch shape: the manager, the batch broadcast, its preparation.

    python bench/scale.py                          # 128 prompts x 8 samples, lengths up to 4096
    python bench/scale.py --prompts 32 --steps 3   # smaller

Two gloo ranks on this machine: this process (trainer rank 0, which owns the real
`RolloutManager`) and a second one it starts from this same file (`--rank 1`). Each step, rank 0
takes a wave from the manager (a fake engine answers every request at once with a long-tailed
length, log-normal, median `--median` tokens, capped at `--max-tokens`; an instant reward scores
it through the real `RewardPool`), both ranks receive the batch by the loop's broadcast, and both
prepare it as `train_on` (rlvr/trainer/step.py) does before any forward (the `TrainBatch` and GRPO advantages).

Printed, over the steps after the first (warm-up):

- `rank-0 overhead: X s per 1M tokens`: rank 0's CPU seconds (`time.process_time`, every thread)
  around take + broadcast + prepare, minus the fake engine's own (its thread CPU time inside
  `generate`), per million generated tokens. Goal: X <= 1.0.
- `peak rss: Y MB` per rank: the growth of the process's peak RSS (VmHWM, reset through
  /proc/self/clear_refs after the warm-up step) above its RSS at that reset, against the batch's own
  bytes: the padded `TrainBatch` the losses take plus the batch's flat token arrays (ids, logprobs,
  masks). Goal: within 3x. Rank 0's figure includes the fake engine's `Completion`s (Python lists,
  as an HTTP client's JSON decoding makes them); rank 1's is the broadcast and preparation alone.
- the broadcast's seconds against a baseline measured in the same run: a bare
  `broadcast_object_list` (pickle) of the same batch's flat arrays as tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class CharTokenizer:
    """One id per character: tokenization costs what a fast tokenizer's Python side costs."""

    chat_template = None
    pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 30_000 + 3 for c in text]}

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


class FakeEngine:
    """Answers every request at once: a long-tailed length drawn from the request's seed, random
    ids from a 150k vocabulary as Python lists (what a client's JSON decoding produces). `own_s`
    is the thread CPU time spent here, subtracted from rank 0's overhead."""

    def __init__(self, *, median: int, max_tokens: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.ids = rng.integers(3, 150_000, size=max_tokens * 64, dtype=np.int64)
        self.logprobs = -rng.random(size=max_tokens * 64, dtype=np.float64)
        self.median, self.max_tokens = median, max_tokens
        self.own_s = 0.0
        self.version = 0  # the weights it serves: the bench's "push" sets it

    async def generate(self, requests: list[Any]) -> list[Any]:
        from rlvr.types import Completion

        start = time.thread_time()
        out = []
        for request in requests:
            for j in range(request.n):  # an n-sample request: sample j is seeded seed + j
                rng = np.random.default_rng((request.params.seed or 0) + j)
                budget = request.params.max_new_tokens
                length = int(min(budget, max(1, rng.lognormal(np.log(self.median), 1.0))))
                at = int(rng.integers(0, len(self.ids) - length))
                out.append(
                    Completion(
                        text="x",
                        token_ids=self.ids[at : at + length].tolist(),
                        logprobs=self.logprobs[at : at + length].tolist(),
                        finish_reason="length" if length == budget else "stop",
                        prompt_token_ids=list(request.input_ids),
                        policy_version=self.version,
                    )
                )
        self.own_s += time.thread_time() - start
        return out

    async def close(self) -> None:
        return None


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> float:
    """Reset VmHWM to the current RSS (Linux >= 4.0); the RSS it was reset to."""
    Path("/proc/self/clear_refs").write_text("5")
    return rss_mb("VmRSS")


def make_manager(args: argparse.Namespace):
    from rlvr.collect.manager import RolloutManager
    from rlvr.recipe.schema import Recipe
    from rlvr.rewards.pool import DomainReward, RewardPool
    from rlvr.types import RewardResult, Sample

    recipe = Recipe.model_validate({
        "experiment": {"max_steps": args.steps},
        "model": {"config": {}},
        "data": {"prompts_per_step": args.prompts, "max_prompt_tokens": 4096},
        "domains": {"d": {"tags": ["d"], "files": ["x"], "reward": "math_rule"}},
        "rollout": {"n": args.n, "max_new_tokens": args.max_tokens, "max_staleness": 0},
        "algorithm": {"preset": "grpo"},
    })  # fmt: skip
    rng = np.random.default_rng(1)
    words = ["alpha", "beta", "gamma", "delta", "integral", "prime", "triangle", "sum", "digits", "area"]
    samples = [
        Sample(id=str(i), tag="d", domain="d",
               messages=[{"role": "user", "content": " ".join(rng.choice(words, size=int(rng.integers(20, 80))))}])
        for i in range(args.prompts * args.steps)
    ]  # fmt: skip
    counter = iter(range(10**12))

    async def instant(sample: Any, completion: Any, **_: Any) -> RewardResult:
        return RewardResult(float(next(counter) % 2))

    rewards = RewardPool({"d": DomainReward("instant", instant)})
    engine = FakeEngine(median=args.median, max_tokens=args.max_tokens)
    manager = RolloutManager(recipe, train={"d": samples}, evals={}, tokenizer=CharTokenizer(), client=engine,  # type: ignore[arg-type]
                             rewards=rewards)  # fmt: skip
    return manager, engine, recipe


def prepare(rollout: Any, recipe: Any) -> Any:
    """What `train_on` does before any forward: the TrainBatch, then GRPO advantages."""
    from rlvr.algorithms.advantages import compute_advantages
    from rlvr.trainer.batch import TrainBatch

    batch = TrainBatch.from_rollout(rollout, pad_id=0)  # as train_on starts
    assert batch.rewards is not None
    advantages, returns = compute_advantages(
        cfg=recipe.algorithm, rewards=batch.rewards, group_ids=batch.group_ids, mask=batch.response_mask
    )
    return batch.replace(advantages=advantages, returns=returns)


def broadcast(rollout: Any) -> Any:
    """The loop's broadcast of the step's batch (and its failure line)."""
    from rlvr.trainer import dist as d

    got, _ = d.broadcast_rollout(rollout, None)
    return got


def flat_arrays(rollout: Any) -> dict[str, np.ndarray]:
    """The batch's flat arrays: the baseline's payload and part of the batch's own bytes."""
    return rollout.pack().arrays()


def tensor_bytes(batch: Any) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in vars_of(batch) if isinstance(v, torch.Tensor))


def vars_of(batch: Any) -> list[Any]:
    import dataclasses

    return [getattr(batch, f.name) for f in dataclasses.fields(batch)]


def bare_broadcast(arrays: dict[str, np.ndarray] | None) -> float:
    """Baseline: the same arrays as tensors through a plain pickle broadcast; its seconds."""
    import torch

    from rlvr.trainer import dist as d

    payload = {k: torch.from_numpy(v) for k, v in arrays.items()} if arrays is not None else None
    d.barrier()
    start = time.perf_counter()
    d.broadcast_object(payload)
    return time.perf_counter() - start


def rank_main(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rlvr.trainer import dist as d

    torch.set_num_threads(1)
    d.init_distributed(backend="gloo")
    manager = engine = recipe = None
    if d.rank() == 0:
        manager, engine, recipe = make_manager(args)
    recipe = d.broadcast_object(recipe)
    cpu = engine_s = tokens = 0.0
    bcast = base = 0.0
    own = flat = 0
    base_rss = peak = 0.0
    for step in range(args.steps):
        if step == 1:
            base_rss = reset_peak()
        d.barrier()
        cpu0, engine0 = time.process_time(), engine.own_s if engine is not None else 0.0
        rollout = None
        if manager is not None:  # k = 0: wave `step` is admitted here, so all its work is in the window
            if step == 0:
                manager.start(version=0)
            else:
                manager.resume(version=step)
            rollout, _ = manager.take(step)
        b0 = time.perf_counter()
        rollout = broadcast(rollout)
        b1 = time.perf_counter()
        batch = prepare(rollout, recipe)
        cpu1 = time.process_time()
        if manager is not None:  # the weight push: the next wave waits for the resume above
            manager.pause()
            engine.version = step + 1  # type: ignore[union-attr]
        if step >= 1:
            cpu += cpu1 - cpu0
            engine_s += (engine.own_s if engine is not None else 0.0) - engine0
            tokens += int(batch.response_lens.sum())
            bcast += b1 - b0
            peak = max(peak, rss_mb("VmHWM"))
            arrays = flat_arrays(rollout)
            own = tensor_bytes(batch) + sum(a.nbytes for a in arrays.values())
            flat = sum(a.nbytes for a in arrays.values())
            base += bare_broadcast(arrays if d.rank() == 0 else None)
        del rollout, batch
    if manager is not None:
        manager.close()
    steps = max(args.steps - 1, 1)
    return {
        "rank": d.rank(),
        "overhead_s_per_m": (cpu - engine_s) / max(tokens / 1e6, 1e-9),
        "cpu_s": cpu / steps,
        "engine_s": engine_s / steps,
        "tokens": tokens / steps,
        "peak_mb": peak - base_rss,
        "own_mb": own / 2**20,
        "flat_mb": flat / 2**20,
        "bcast_s": bcast / steps,
        "base_s": base / steps,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prompts", type=int, default=128, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=4096, help="response length cap")
    parser.add_argument("--median", type=int, default=512, help="median response length (log-normal, sigma 1)")
    parser.add_argument("--steps", type=int, default=3, help="steps, the first a warm-up")
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK=str(args.rank), WORLD_SIZE="2")
    os.environ.update(LOCAL_RANK=str(args.rank), CUDA_VISIBLE_DEVICES="")
    if args.rank == 1:
        print(json.dumps(rank_main(args)), flush=True)
        return
    peer = subprocess.Popen(
        [sys.executable, __file__, *sys.argv[1:], "--rank", "1", "--port", str(args.port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    mine = rank_main(args)
    out, _ = peer.communicate(timeout=600)
    theirs = json.loads(out.strip().splitlines()[-1])
    print(f"{args.prompts} prompts x {args.n}, lengths log-normal (median {args.median}, cap {args.max_tokens}); "
          f"{mine['tokens'] / 1e6:.2f}M generated tokens per step, {args.steps - 1} measured step(s)")  # fmt: skip
    print(f"rank-0 overhead: {mine['overhead_s_per_m']:.2f} s per 1M tokens "
          f"(CPU {mine['cpu_s']:.2f} s/step, minus the fake engine's {mine['engine_s']:.2f} s)")  # fmt: skip
    for r in (mine, theirs):
        print(f"peak rss: {r['peak_mb']:.0f} MB on rank {r['rank']} over {r['own_mb']:.0f} MB of the batch's own bytes "
              f"(flat token arrays {r['flat_mb']:.0f} MB): {r['peak_mb'] / max(r['own_mb'], 1e-9):.2f}x "
              f"(process max rss {r['maxrss_mb']:.0f} MB)")  # fmt: skip
    print(f"broadcast: {mine['bcast_s']:.3f} s/step; bare pickle broadcast of the flat arrays {mine['base_s']:.3f} s: "
          f"{mine['bcast_s'] / max(mine['base_s'], 1e-9):.2f}x")  # fmt: skip
    if theirs["rank"] == 1:
        print(f"rank 1 CPU (broadcast + prepare): {theirs['cpu_s']:.2f} s/step")


if __name__ == "__main__":
    main()
