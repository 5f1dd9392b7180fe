"""How much of a step the asynchronous loop hides, at GPU-like ratios, with no GPU.

    python bench/pipeline.py                       # k = 0, 1, 2; 12 steps each
    python bench/pipeline.py --train-s 0.6 --tpot-ms 4 --steps 20

The real `RolloutManager` (waves, episodes, streaming rewards, the staleness bound, pause/abort
and partial rollouts) drives a fake engine and a fake trainer:

- engine: every request decodes its tokens at `--tpot-ms` per token whatever the batch (a GPU
  decodes a batch in about the time of one sequence); response lengths are long-tailed
  (log-normal, capped at `--max-tokens`), so a step's generation lasts as long as its longest
  sample; a weight push aborts what is in flight, which then continues (partial rollout);
- rewards: `--reward-ms` per group, after its samples finish;
- trainer: `--train-s` of sleep per step (sleep releases the GIL, as GPU work does), then a
  `--sync-s` weight push.

The synchronous loop (k = 0) pays generation + rewards + train + sync every step; with k >= 1
generation and rewards run during training, so a step approaches max(generation, train + sync).
Prints, per k: mean step time, the ideal max(...) and sum(...) measured from the k = 0 run's own
phases, and step / ideal (1.00 = perfect overlap). The fake times make this repeatable on any
machine: it measures the loop's scheduling, not hardware.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr.collect.manager import RolloutManager  # noqa: E402 (after the path fix-up)
from rlvr.recipe.schema import Recipe  # noqa: E402
from rlvr.types import Completion, Group, RewardResult, Sample  # noqa: E402


class TimedEngine:
    """Decodes `length` tokens at `tpot` seconds each; pause aborts in-flight requests (partial)."""

    def __init__(self, *, tpot: float, max_tokens: int, seed: int = 0) -> None:
        self.tpot, self.max_tokens = tpot, max_tokens
        self.rng = random.Random(seed)
        self.version = 0
        self.in_flight: set[asyncio.Event] = set()

    def length(self) -> int:
        return max(1, min(self.max_tokens, int(self.rng.lognormvariate(4.0, 0.9))))

    async def generate(self, requests: list[Any]) -> list[Completion]:
        """A group's n-sample request decodes its n samples side by side, each its own length."""
        (request,) = requests
        return list(await asyncio.gather(*(self._sample(request) for _ in range(request.n))))

    async def _sample(self, request: Any) -> Completion:
        target = min(self.length(), request.params.max_new_tokens)
        abort = asyncio.Event()
        self.in_flight.add(abort)
        start = time.perf_counter()
        try:
            try:
                await asyncio.wait_for(abort.wait(), timeout=target * self.tpot)
                done = min(target, int((time.perf_counter() - start) / self.tpot))
                finish = "abort"
            except TimeoutError:
                done, finish = target, "stop"
        finally:
            self.in_flight.discard(abort)
        return Completion(text="", token_ids=[5] * done, logprobs=[-1.0] * done, finish_reason=finish,
                          prompt_token_ids=list(request.input_ids), policy_version=self.version)  # fmt: skip

    def push(self, version: int) -> None:
        for event in self.in_flight:
            event.set()
        self.version = version


class SlowRewards:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        await asyncio.sleep(self.seconds)
        for group in groups:
            group.rewards = [RewardResult(random.random()) for _ in group.completions]
        return {}

    def close(self) -> None:
        pass


class Tokenizer:
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 50 + 3 for c in text]}


def run(k: int, args: argparse.Namespace) -> dict[str, float]:
    recipe = Recipe.model_validate({
        "experiment": {"max_steps": args.steps},
        "model": {"config": {}},
        "data": {"prompts_per_step": args.prompts},
        "domains": {"d": {"tags": ["d"], "files": ["x"], "reward": "math_rule"}},
        "rollout": {"n": args.n, "max_new_tokens": args.max_tokens, "max_staleness": k},
        "algorithm": {"preset": "grpo", "tis_cap": 2.0},
    })  # fmt: skip
    samples = [
        Sample(id=str(i), tag="d", domain="d", messages=[{"role": "user", "content": f"q{i}"}]) for i in range(64)
    ]
    engine = TimedEngine(tpot=args.tpot_ms / 1000, max_tokens=args.max_tokens)
    manager = RolloutManager(recipe, train={"d": samples}, evals={}, tokenizer=Tokenizer(), client=engine,  # type: ignore[arg-type]
                             rewards=SlowRewards(args.reward_ms / 1000))  # type: ignore[arg-type]  # fmt: skip
    rollout, steps = [], []
    manager.start(version=0)
    for step in range(args.steps):
        start = time.perf_counter()
        _, metrics = manager.take(step)
        rollout.append(metrics["time/rollout"])
        time.sleep(args.train_s)
        manager.pause()
        time.sleep(args.sync_s)
        manager.loop.call_soon_threadsafe(engine.push, step + 1)
        manager.resume(version=step + 1)
        steps.append(time.perf_counter() - start)
    manager.close()
    warm = steps[1:] or steps
    return {"step": sum(warm) / len(warm), "rollout": sum(rollout[1:] or rollout) / len(rollout[1:] or rollout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--tpot-ms", type=float, default=2.0, help="decode time per token")
    parser.add_argument("--max-tokens", type=int, default=512, help="response length cap")
    parser.add_argument("--reward-ms", type=float, default=100.0, help="reward time per group")
    parser.add_argument("--train-s", type=float, default=1.0, help="trainer time per step")
    parser.add_argument("--sync-s", type=float, default=0.1, help="weight push time")
    parser.add_argument("--ks", default="0,1,2", help="max_staleness values to run")
    args = parser.parse_args()
    results = {k: run(k, args) for k in (int(x) for x in args.ks.split(","))}
    base = results.get(0) or next(iter(results.values()))
    ideal = max(base["rollout"], args.train_s + args.sync_s)
    serial = base["rollout"] + args.train_s + args.sync_s
    print(f"{args.prompts} prompts x {args.n}, {args.tpot_ms} ms/token (log-normal lengths, cap {args.max_tokens}), "
          f"rewards {args.reward_ms:.0f} ms/group, train {args.train_s} s, sync {args.sync_s} s")  # fmt: skip
    print(
        f"generation + rewards per step (k=0): {base['rollout']:.2f} s; ideal max(...) {ideal:.2f} s; sum {serial:.2f} s"
    )
    print(f"{'k':>3} {'step s':>8} {'step / ideal':>13} {'sum / step':>11}")
    for k, r in results.items():
        print(f"{k:>3} {r['step']:8.2f} {r['step'] / ideal:13.2f} {serial / r['step']:11.2f}")


if __name__ == "__main__":
    main()
