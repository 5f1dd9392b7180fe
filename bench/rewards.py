"""Reward throughput: math verifications/s through the pool, sandbox runs/s vs a bare subprocess.

    python bench/rewards.py [--math N] [--sandbox N] [--workers W]

The baseline (`subprocess.run([sys.executable, "-c", "pass"])`) is measured in the same
run, so the sandbox cost is reported as a ratio that means something on any machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlvr.rewards.pool import RewardPool  # noqa: E402
from rlvr.types import Completion, Group, Sample  # noqa: E402


def pair(i: int) -> tuple[str, str]:
    """Distinct inputs per i: math-verify caches parses, so repeating pairs would flatter it."""
    k = i + 1
    forms = [
        (f"\\frac{{{k}}}{{2}}", str(k / 2)),
        (f"\\sqrt{{{k}}}/{k}", f"1/\\sqrt{{{k}}}"),
        (f"\\{{{k},{k + 1}\\}}", f"\\{{{k + 1},{k}\\}}"),
        (f"[{k},{k + 1})", f"[{k}, {k + 1})"),
        (str(k), str(k + 1)),
    ]
    return forms[i % len(forms)]


def completion(text: str) -> Completion:
    return Completion(text=text, token_ids=[], logprobs=[])


async def bench_math(n: int, workers: int) -> float:
    pool = RewardPool.from_domains({"math": ("math_rule", {})}, max_workers=workers)
    warm = [
        Group(Sample("w", "m", [], domain="math", ground_truth="1/3"), [completion("\\boxed{0.3333333}")])
    ] * workers
    await pool.score_groups(warm)  # workers started and math-verify imported
    groups = [
        Group(Sample(str(i), "m", [], domain="math", ground_truth=pair(i)[0]), [completion(f"\\boxed{{{pair(i)[1]}}}")])
        for i in range(n)
    ]  # fmt: skip
    start = time.perf_counter()
    metrics = await pool.score_groups(groups)
    seconds = time.perf_counter() - start
    pool.close()
    print(
        f"math_rule: {n / seconds:8.1f} verifications/s with {workers} workers (p50 {metrics['reward/math/latency_p50_s'] * 1e3:.1f} ms)"
    )
    return n / seconds


def bench_baseline(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    rate = n / (time.perf_counter() - start)
    print(f"baseline : {rate:8.1f} bare `python -c pass` subprocesses/s (sequential)")
    return rate


async def bench_sandbox(n: int, concurrent: bool) -> float:
    from rlvr.rewards.code_sandbox import score

    sample = Sample("s", "c", [], case_type="assert", test_cases=["assert f(2) == 4"])
    text = "```python\ndef f(x):\n    return 2 * x\n```"
    start = time.perf_counter()
    if concurrent:
        results = await asyncio.gather(*(score(sample, completion(text)) for _ in range(n)))
    else:
        results = [await score(sample, completion(text)) for _ in range(n)]
    rate = n / (time.perf_counter() - start)
    assert all(r.score == 1.0 for r in results), results[0]
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--math", type=int, default=200)
    parser.add_argument("--sandbox", type=int, default=40)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}")
    asyncio.run(bench_math(args.math, args.workers))
    base = bench_baseline(args.sandbox)
    seq = asyncio.run(bench_sandbox(args.sandbox, concurrent=False))
    con = asyncio.run(bench_sandbox(args.sandbox, concurrent=True))
    print(f"sandbox  : {seq:8.1f} runs/s sequential = {seq / base:.2f}x baseline")
    print(f"sandbox  : {con:8.1f} runs/s concurrent = {con / base:.2f}x baseline (semaphore = cpu count)")


if __name__ == "__main__":
    main()
