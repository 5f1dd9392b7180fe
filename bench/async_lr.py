"""What asynchronous rollout costs in learning: the quickstart's reward curves at k = 0, 1, 2, at several lrs.

    python bench/async_lr.py                          # k = 0 1 2 x lr = 2e-4 1e-4, 20 steps (~15 min, 2 cores)
    python bench/async_lr.py --ks 0 1 --lrs 2e-4 --seeds 0 1 2
    python bench/async_lr.py --reuse                  # print from the runs already under --out

Each run is `rlvr launch recipes/quickstart.toml --no-dashboard --resume none` with
`rollout.max_staleness = k`, `trainer.lr = lr`, `experiment.seed = seed`, `algorithm.tis_cap`
(the same for every k, so k = 0 differs only by its staleness) and no evaluation, one run at a
time (the rollout server, judge, sandbox and trainer already share the machine's cores). The
reward is `reward/mean` from the run's metrics.jsonl (every training sample of the step,
before filters).

Prints, per run, the per-step curve, then a table: reward over steps 1-5 (mean) against steps
16-20 (the last five), the gain, the gain relative to the k = 0 run of the same lr and seed
(the baseline measured in this same invocation), and the largest `mismatch_kl` and the last
entropy. Twenty steps of 16 prompts x 8 samples are noisy (a step's mean moves by about +-0.07
from sampling alone), so read a ratio near 1 as "learns like synchronous", near 0 or below as
"does not learn"; `--seeds` repeats each cell with other seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAD = 5  # steps averaged for "first"
TAIL = 5  # steps averaged for "last"


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def run_dir(out: Path, *, seed: int, lr: str, k: int) -> Path:
    return out / f"s{seed}_lr{lr}_k{k}"


def metrics_of(path: Path) -> list[dict[str, float]]:
    """The run's metrics rows, last row per step (a rerun logs every step once, but be safe)."""
    files = sorted(path.glob("*/metrics.jsonl"))
    if not files:
        return []
    rows: dict[int, dict[str, float]] = {}
    for line in files[0].read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[int(row["step"])] = row
    return [rows[s] for s in sorted(rows)]


def launch(
    recipe: str, *, out: Path, seed: int, lr: str, k: int, steps: int, tis_cap: float, extra: list[str]
) -> float:
    """One run to completion; its wall seconds. A failed run raises with its log's tail."""
    target = run_dir(out, seed=seed, lr=lr, k=k)
    sets = {
        "experiment.max_steps": str(steps),
        "experiment.output_dir": str(target),
        "experiment.seed": str(seed),
        "experiment.eval_steps": "0",
        "experiment.save_steps": "0",
        "rollout.max_staleness": str(k),
        "algorithm.tis_cap": str(tis_cap),
        "trainer.lr": lr,
    }
    cmd = [sys.executable, "-m", "rlvr.cli", "launch", recipe, "--no-dashboard", "--resume", "none"]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    for item in extra:
        cmd += ["--set", item]
    target.mkdir(parents=True, exist_ok=True)
    log = target / "launch.log"
    start = time.perf_counter()
    with log.open("w") as fh:
        code = subprocess.call(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"run k={k} lr={lr} seed={seed} exited {code}:\n{tail}")
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipes/quickstart.toml")
    p.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2], help="rollout.max_staleness values")
    p.add_argument("--lrs", nargs="+", default=["2e-4", "1e-4"], help="trainer.lr values (as written)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tis-cap", type=float, default=2.0, help="algorithm.tis_cap for every run (k = 0 too)")
    p.add_argument("--out", type=Path, default=Path("/tmp/rlvr-bench-async-lr"))
    p.add_argument("--reuse", action="store_true", help="keep runs under --out that already have every step")
    p.add_argument("--set", dest="extra", action="append", default=[], help="more KEY=VALUE overrides, every run")
    args = p.parse_args()
    if 0 not in args.ks:
        args.ks = [0, *args.ks]  # the baseline every ratio is taken against
    if args.steps < HEAD + TAIL:
        raise SystemExit(f"--steps must be at least {HEAD + TAIL} (first {HEAD} against last {TAIL})")

    curves: dict[tuple[int, str, int], list[dict[str, float]]] = {}
    for seed in args.seeds:
        for lr in args.lrs:
            for k in args.ks:
                target = run_dir(args.out, seed=seed, lr=lr, k=k)
                rows = metrics_of(target) if args.reuse else []
                if len(rows) < args.steps:
                    wall = launch(
                        args.recipe,
                        out=args.out,
                        seed=seed,
                        lr=lr,
                        k=k,
                        steps=args.steps,
                        tis_cap=args.tis_cap,
                        extra=args.extra,
                    )
                    rows = metrics_of(target)
                    print(f"ran seed={seed} lr={lr} k={k}: {wall:.0f} s", flush=True)
                curves[(seed, lr, k)] = rows[: args.steps]

    print("\nreward/mean per step")
    names = [f"s{s} lr{lr} k{k}" for (s, lr, k) in curves]
    print("step " + " ".join(f"{n:>15}" for n in names))
    for i in range(args.steps):
        cells = [f"{rows[i]['reward/mean']:15.3f}" if i < len(rows) else " " * 15 for rows in curves.values()]
        print(f"{i + 1:4d} " + " ".join(cells))

    print(
        f"\nseed  lr       k  steps 1-{HEAD}  steps {args.steps - TAIL + 1}-{args.steps}   gain  gain/k0  max mismatch_kl  entropy"
    )
    for (seed, lr, k), rows in curves.items():
        rewards = [r["reward/mean"] for r in rows]
        first, last = mean(rewards[:HEAD]), mean(rewards[-TAIL:])
        base = [r["reward/mean"] for r in curves[(seed, lr, 0)]]
        base_gain = mean(base[-TAIL:]) - mean(base[:HEAD])
        gain = last - first
        ratio = gain / base_gain if abs(base_gain) > 1e-9 else math.nan
        kl = max((r.get("mismatch_kl", 0.0) for r in rows), default=0.0)
        entropy = rows[-1].get("entropy", math.nan) if rows else math.nan
        print(
            f"{seed:4d}  {lr:7s} {k:2d}  {first:10.3f}  {last:11.3f}  {gain:+6.3f}  {ratio:7.2f}"
            f"  {kl:15.4f}  {entropy:7.3f}"
        )


if __name__ == "__main__":
    main()
