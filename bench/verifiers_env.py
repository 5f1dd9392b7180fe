"""A verifiers-backed domain against the equivalent native `math_rule` domain, per sample.

    python bench/verifiers_env.py [--samples N] [--rounds R] [--workers W]

The verifiers side is a single-turn taskset written here (`bench_sums`): the same N questions and gold
answers as the native side, in two variants that differ only in the check their `@vf.reward` runs:

- `vf[rlvr check]`: math_rule's own check (`judge_text`, math-verify with math_rule's configs), so the
  ratio to native is what the verifiers plumbing costs (the row's task rebuilt, a `vf.Trace`, the
  task's async `score`, the worker round trip);
- `vf[vf check]`: verifiers' own `vf.verify_boxed_math_answer` (math-verify with its defaults), what a
  published math taskset runs; its ratio adds the difference between the two checkers.

Two costs per sample, each through rlvr's real code:

- rows: the domain's rows made into Samples (`verifiers_samples`: the taskset's load(), the task data
  kept for scoring) against `load_domain_samples` reading the same rows from a .jsonl file;
- score: one completion per row scored through the `RewardPool` as a run scores a step, both in `W`
  reward worker processes.

- plumbing: in this process, `judge_row` (what a reward worker runs for a verifiers row) against math_rule's
  `judge_text` on the same form of input, fresh inputs each, paired and alternated: the verifiers
  plumbing alone, without the pool's scheduling noise.

Every answer needs math-verify (no form math_rule's exact-match shortcut settles), and inputs are
distinct per sample (math-verify caches parses). Each round measures the sides back to back in a
rotated order (the machine is shared and noisy: the ranges over rounds are what to read). Printed:
per-sample µs of each side and its ratio to native (min-max over the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlvr.data.base import LoadReport  # noqa: E402
from rlvr.data.sources import load_domain_samples  # noqa: E402
from rlvr.data.verifiers_rows import verifiers_samples  # noqa: E402
from rlvr.plugins import add_plugin_dir  # noqa: E402
from rlvr.recipe.schema import DomainConfig  # noqa: E402
from rlvr.rewards import verifiers_env  # noqa: E402
from rlvr.rewards.pool import RewardPool  # noqa: E402
from rlvr.types import Completion, Group, Sample  # noqa: E402

TASKSET = '''
import verifiers.v1 as vf

FORMS = [
    ("\\\\frac{{{k}}}{{2}}", "{half}"),
    ("\\\\sqrt{{{k}}}/{k}", "1/\\\\sqrt{{{k}}}"),
    ("\\\\{{{k},{k1}\\\\}}", "\\\\{{{k1},{k}\\\\}}"),
    ("{k}", "{k1}"),
]


def pair(i):
    """(gold, the answer the bench's completion gives) for row i: distinct per i."""
    k = i + 1
    gold, said = FORMS[i % len(FORMS)]
    values = {"k": k, "k1": k + 1, "half": k / 2}
    return gold.format(**values), said.format(**values)


class SumData(vf.TaskData):
    answer: str


class SumConfig(vf.TaskConfig):
    check: str = "vf"


class BenchConfig(vf.TasksetConfig):
    n: int = 100
    task: SumConfig = SumConfig()


class SumTask(vf.Task[SumData, vf.State, SumConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        if self.config.check == "rlvr":
            from rlvr.rewards.math_rule import judge_text

            return float(judge_text(task.answer, trace.last_reply, timeout_s=10)[0])
        return vf.verify_boxed_math_answer(trace.last_reply, task.answer)


class BenchSums(vf.Taskset[SumTask, BenchConfig]):
    def load(self):
        for i in range(self.config.n):
            gold, _ = pair(i)
            yield SumTask(SumData(prompt=f"Question {i}: simplify.", answer=gold), self.config.task)


__all__ = ["BenchSums"]
'''


def completion(text: str) -> Completion:
    return Completion(text=text, token_ids=[], logprobs=[])


def native_rows(path: Path, n: int) -> list[Sample]:
    return load_domain_samples([str(path)], domain="native", tags=["m"], reward="math_rule", report=LoadReport())


def vf_rows(n: int, check: str) -> list[Sample]:
    args = {"n": n, "task": {"check": check}}
    domain = DomainConfig.model_validate(
        {"tags": ["v"], "reward": "verifiers", "verifiers": {"taskset": "bench_sums", "args": args}}
    )
    return verifiers_samples("vf", domain, evaluation=False)


SIDES = {"native": "native math_rule", "vf_rlvr": "vf[rlvr check]", "vf_vf": "vf[vf check]"}


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


async def score(pool: RewardPool, groups: list[Group]) -> float:
    start = time.perf_counter()
    metrics = await pool.score_groups(groups)
    seconds = time.perf_counter() - start
    domain = groups[0].sample.domain
    assert metrics[f"reward/{domain}/failed"] == 0 and metrics[f"reward/{domain}/mean"] > 0.5, metrics
    return seconds


def bench_plumbing(n: int, pair) -> tuple[float, float]:
    """(ms per sample of `judge_row` on a vf[rlvr check] row, of `judge_text` on the native one): row i
    against native input i + n (the same form: n is rounded to a multiple of the forms), each input
    scored once, which goes first alternating."""
    from rlvr.rewards.math_rule import judge_text

    n -= n % 4
    rows = vf_rows(2 * n, "rlvr")
    totals = {"row": 0.0, "text": 0.0}
    for i in range(n):
        pairs = [("row", i), ("text", i + n)]
        for kind, k in pairs if i % 2 else pairs[::-1]:
            said = f"The answer is \\boxed{{{pair(k)[1]}}}."
            start = time.perf_counter()
            if kind == "row":
                verifiers_env.judge_row(rows[k].extra["verifiers"], said, sample_id=rows[k].id)
            else:
                judge_text(pair(k)[0], said, timeout_s=10)
            totals[kind] += time.perf_counter() - start
    return totals["row"] / n * 1e3, totals["text"] / n * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    n = args.samples
    folder = Path(tempfile.mkdtemp(prefix="rlvr-bench-vf-"))
    (folder / "bench_sums.py").write_text(textwrap.dedent(TASKSET))
    add_plugin_dir(folder)  # as launch does for the recipe's folder; the reward workers inherit it
    from bench_sums import pair  # pyright: ignore[reportMissingImports]

    data = folder / "native.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"Question {i}: simplify.", "ground_truth": pair(i)[0]}) + "\n" for i in range(n))
    )
    verifiers_env.verifiers()  # the import (seconds, once per process) is not a per-sample cost
    pools = SimpleNamespace(
        native=RewardPool.from_domains({"native": ("math_rule", {})}, max_workers=args.workers),
        vf=RewardPool.from_domains({"vf": ("verifiers", {})}, max_workers=args.workers),
    )

    def rows(side: str) -> list[Sample]:
        return native_rows(data, n) if side == "native" else vf_rows(n, side.removeprefix("vf_"))

    for side in SIDES:  # workers up, math-verify and verifiers imported in them
        warm = rows(side)[:8]
        pool = pools.native if side == "native" else pools.vf
        asyncio.run(score(pool, [Group(s, [completion(f"\\boxed{{{pair(i)[1]}}}")]) for i, s in enumerate(warm)]))
    print(f"cpus: {os.cpu_count()}; {n} samples per side per round; {args.workers} reward workers per side")
    results: dict[str, dict[str, list[float]]] = {"rows": {s: [] for s in SIDES}, "score": {s: [] for s in SIDES}}
    order = list(SIDES)
    for r in range(args.rounds):
        for side in order[r % 3 :] + order[: r % 3]:  # rotated: each side goes first as often
            verifiers_env._loaded.cache_clear()  # the taskset's class and config resolved again, as a new run would
            seconds, made = timed(rows, side)
            assert isinstance(made, list) and len(made) == n
            results["rows"][side].append(seconds / n)
            groups = [Group(s, [completion(f"The answer is \\boxed{{{pair(i)[1]}}}.")]) for i, s in enumerate(made)]
            pool = pools.native if side == "native" else pools.vf
            results["score"][side].append(asyncio.run(score(pool, groups)) / n)
    pools.native.close()
    plumbing = bench_plumbing(n, pair)

    def span(values: list[float]) -> str:
        return f"{min(values) * 1e6:8.1f}-{max(values) * 1e6:8.1f} µs"

    for what, by_side in results.items():
        native = by_side["native"]
        for side, label in SIDES.items():
            line = f"{what:5s} {label:16s}: {span(by_side[side])} per sample"
            if side != "native":
                ratios = [v / b for v, b in zip(by_side[side], native, strict=True)]
                line += f"   {min(ratios):.2f}x-{max(ratios):.2f}x native"
            print(line)
    print(f"({args.rounds} rounds, order rotated; ratios are per round, against native in the same round)")
    row_ms, text_ms = plumbing
    print(
        f"plumbing: judge_row {row_ms:.2f} ms vs judge_text {text_ms:.2f} ms per sample in-process "
        f"({row_ms - text_ms:+.2f} ms, {row_ms / text_ms:.2f}x; {n} pairs, same forms, fresh inputs)"
    )


if __name__ == "__main__":
    main()
