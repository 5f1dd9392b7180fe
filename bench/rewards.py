"""Reward throughput: math verifications/s through the pool, sandbox runs/s vs a bare subprocess.

    python bench/rewards.py [--math N] [--sandbox N] [--rounds R] [--workers W]

The baseline is `subprocess.run([<the interpreter the sandbox runs>, "-c", "pass"])`, measured
in the same run and alternated with the sandbox in R rounds (the machine is noisy: the
ranges are what to read). Sandbox runs are one `assert` sample (judge + solution, two
sandboxes) and one `stdin_stdout` sample (one sandbox), each scored one at a time.
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
from rlvr.sandbox.local import sandbox_python  # noqa: E402
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


def bench_baseline(n: int, python: str) -> float:
    start = time.perf_counter()
    for _ in range(n):
        subprocess.run([python, "-c", "pass"], check=True)
    return n / (time.perf_counter() - start)


SAMPLES = {
    "assert": (
        Sample("s", "c", [], case_type="assert", test_cases=["assert f(2) == 4"]),
        "```python\ndef f(x):\n    return 2 * x\n```",
    ),
    "stdin_stdout": (
        Sample("s", "c", [], case_type="stdin_stdout", test_cases=[{"input": "2\n", "output": "4"}]),
        "```python\nprint(2 * int(input()))\n```",
    ),
}


async def bench_sandbox(n: int, kind: str) -> float:
    from rlvr.rewards.code_sandbox import score

    sample, text = SAMPLES[kind]
    start = time.perf_counter()
    results = [await score(sample, completion(text)) for _ in range(n)]
    rate = n / (time.perf_counter() - start)
    assert all(r.score == 1.0 for r in results), results[0]
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--math", type=int, default=200)
    parser.add_argument("--sandbox", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    python = sandbox_python()
    print(f"cpus: {os.cpu_count()}; sandbox interpreter: {python}")
    if args.math:
        asyncio.run(bench_math(args.math, args.workers))
    asyncio.run(bench_sandbox(2, "assert"))  # warm: sandbox probed, harness files read
    ratios: dict[str, list[float]] = {"assert": [], "stdin_stdout": []}
    bases = []
    for _ in range(args.rounds):  # alternate baseline and sandbox: noise hits both
        for kind in ratios:
            base = bench_baseline(args.sandbox, python)
            rate = asyncio.run(bench_sandbox(args.sandbox, kind))
            bases.append(base)
            ratios[kind].append(rate / base)
    print(f"baseline : {min(bases):6.1f}-{max(bases):6.1f} bare `{python} -c pass` runs/s (one at a time)")
    for kind, values in ratios.items():
        print(
            f"sandbox  : {kind:12s} {min(values):.2f}x-{max(values):.2f}x baseline, one at a time ({args.rounds} rounds)"
        )


if __name__ == "__main__":
    main()
