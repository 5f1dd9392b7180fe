"""Static vs adaptive domain mix (with and without difficulty pools): what each step spends on
groups that teach nothing, and each domain's eval at the end.

Runs one recipe through `rlvr launch` once per setting, one after another, same seed and steps:
`static` (the recipe as written, the baseline of this invocation), `adaptive` (data.mix =
"adaptive"), `adaptive+pools` (plus a difficulty pool on every domain) and `static+pools` (the
pools alone; `--only` picks settings). Prints per setting the
share of judged groups with no reward spread per step (`groups/zero_spread_frac`) and its mean,
generated tokens per step, wall clock, each domain's final eval, and the ratios to static.

    python bench/mix.py --recipe recipes/smollm2_mix.toml --steps 8
    python bench/mix.py --steps 12 --rows 8 --retire-after 1 --revisit-after 6   # prompts recur

`--rows N` trains every setting on the first N rows of each domain (written to --out; a gym
domain generates N): prompts then come back every few steps, as over many epochs of a real data
set, which is where a difficulty pool acts; the eval sets stay whole.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SETTINGS: dict[str, list[str]] = {
    "static": [],
    "adaptive": ["data.mix=adaptive"],
    "adaptive+pools": ["data.mix=adaptive"],
    "static+pools": [],
}


def pools(recipe: Path, *, retire_after: int, retire_failed_after: int | None, revisit_after: int) -> list[str]:
    """A difficulty pool on each domain of `recipe` (read with the recipe loader)."""
    from rlvr.recipe.load import load_recipe

    failed = f"retire_failed_after={retire_failed_after}," if retire_failed_after else ""
    table = f"{{retire_after={retire_after},{failed}revisit_after={revisit_after}}}"
    return [f"domains.{n}.pool={table}" for n in load_recipe(recipe, []).domains]


def first_rows(recipe: Path, rows: int, out: Path) -> list[str]:
    """Overrides that train each domain of `recipe` on its first `rows` rows (copies under `out`)."""
    from rlvr.recipe.load import load_recipe

    overrides: list[str] = []
    out.mkdir(parents=True, exist_ok=True)
    for name, domain in load_recipe(recipe, []).domains.items():
        if domain.gym is not None:
            overrides.append(f"domains.{name}.gym.size={rows}")
            continue
        lines = [line for file in domain.files for line in Path(file).read_text().splitlines() if line.strip()]
        path = out / f"{name}_first{rows}.jsonl"
        path.write_text("\n".join(lines[:rows]) + "\n")
        overrides.append(f'domains.{name}.files=["{path.resolve()}"]')
    return overrides


def run(recipe: Path, out: Path, overrides: list[str]) -> float:
    command = [sys.executable, "-m", "rlvr.cli", "launch", str(recipe), "--no-dashboard", "--resume", "none",
               "--set", f"experiment.output_dir={out}"]  # fmt: skip
    for item in overrides:
        command += ["--set", item]
    start = time.perf_counter()
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit(f"{out}: rlvr launch failed ({result.returncode}): {result.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


def read(out: Path) -> list[dict[str, float]]:
    (path,) = out.glob("*/metrics.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=Path("recipes/smollm2_mix.toml"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, help="experiment.seed for every setting (default: the recipe's)")
    parser.add_argument("--floor", type=float, default=0.15, help="data.mix_floor for the adaptive settings")
    parser.add_argument("--smoothing", type=float, default=0.5, help="data.mix_smoothing")
    parser.add_argument("--retire-after", type=int, default=2)
    parser.add_argument("--retire-failed-after", type=int, help="all-wrong groups before a prompt rests")
    parser.add_argument("--revisit-after", type=int, default=4)
    parser.add_argument("--rows", type=int, help="train on each domain's first ROWS rows (prompts recur)")
    parser.add_argument("--only", nargs="+", choices=list(SETTINGS), default=list(SETTINGS)[:3])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_mix"))
    parser.add_argument("--reuse", action="store_true", help="report the runs already in --out, run none")
    parser.add_argument("--plot", type=Path, help="also draw the zero-spread share per step into this PNG")
    args = parser.parse_args()
    common = [f"experiment.max_steps={args.steps}", f"experiment.eval_steps={args.steps}", "experiment.save_steps=0",
              "experiment.eval_at_start=false"] + ([f"experiment.seed={args.seed}"] if args.seed is not None else [])  # fmt: skip
    if args.rows:
        common += first_rows(args.recipe, args.rows, args.out / "data")
    adaptive = [f"data.mix_floor={args.floor}", f"data.mix_smoothing={args.smoothing}"]
    pooled = pools(args.recipe, retire_after=args.retire_after, retire_failed_after=args.retire_failed_after,
                   revisit_after=args.revisit_after)  # fmt: skip
    extra = {"static": [], "adaptive": adaptive, "adaptive+pools": adaptive + pooled, "static+pools": pooled}
    results: dict[str, tuple[float, list[dict[str, float]]]] = {}
    for name in args.only:
        out = args.out / name
        wall = float("nan") if args.reuse else run(args.recipe, out, common + SETTINGS[name] + extra[name])
        results[name] = (wall, read(out))
        print(f"{name}: {wall / 60:.1f} min", flush=True)
    report(results)
    if args.plot:
        plot(results, args.plot)


def plot(results: dict[str, tuple[float, list[dict[str, float]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, (_, rows) in results.items():
        steps = [r["step"] for r in rows if "groups/zero_spread_frac" in r]
        shares = [r["groups/zero_spread_frac"] for r in rows if "groups/zero_spread_frac" in r]
        (line,) = left.plot(steps, shares, alpha=0.25)
        # nine groups a step move the share by 0.11 a group: the mean of the last 4 steps is the signal
        smooth = [mean(shares[max(0, i - 3) : i + 1]) for i in range(len(shares))]
        left.plot(steps, smooth, color=line.get_color(), linewidth=2, label=name)
    left.set(title="groups with no reward spread (4-step mean)", xlabel="step", ylabel="share of judged groups")
    left.legend()
    names, doms = list(results), domains(results)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        last = results[name][1][-1]
        right.bar([j + i * width for j in range(len(doms))], [last.get(f"eval/reward/{d}/mean", 0.0) for d in doms],
                  width=width, label=name)  # fmt: skip
    right.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(doms))], doms)
    right.set(title="held-out eval at the last step", ylabel="mean reward (greedy)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(results: dict[str, tuple[float, list[dict[str, float]]]]) -> None:
    base = results.get("static")
    print("\nzero-spread share of judged groups per step (groups that teach nothing):")
    for name, (_, rows) in results.items():
        print(f"  {name:>15}: " + " ".join(f"{r.get('groups/zero_spread_frac', float('nan')):.2f}" for r in rows))
    print("\nsetting          zero-spread  tokens/step  wall min  " + "  ".join(domains(results)))
    for name, (wall, rows) in results.items():
        zero = mean([r["groups/zero_spread_frac"] for r in rows if "groups/zero_spread_frac" in r])
        tokens = mean([r["rollout/generated_tokens"] for r in rows if "rollout/generated_tokens" in r])
        evals = [rows[-1].get(f"eval/reward/{d}/mean", float("nan")) for d in domains(results)]
        ratio = ""
        if base is not None and name != "static":
            base_zero = mean([r["groups/zero_spread_frac"] for r in base[1] if "groups/zero_spread_frac" in r])
            ratio = f"   {zero / base_zero:.2f}x static's zero-spread share" if base_zero else ""
        cells = "  ".join(f"{e:>{len(d)}.3f}" for e, d in zip(evals, domains(results), strict=True))
        print(f"{name:<16} {zero:>11.3f} {tokens:>12.0f} {wall / 60:>9.1f}  {cells}{ratio}")
    shares = {name: rows[-1] for name, (_, rows) in results.items() if any(k.startswith("mix/") for k in rows[-1])}
    for name, last in shares.items():
        print(
            f"{name} shares at the last step: "
            + ", ".join(f"{k[4:]} {v:.2f}" for k, v in last.items() if k.startswith("mix/"))
        )


def domains(results: dict[str, tuple[float, list[dict[str, float]]]]) -> list[str]:
    keys = {k for _, rows in results.values() for k in rows[-1] if k.startswith("eval/reward/") and k.endswith("/mean")}
    return sorted(k.split("/")[2] for k in keys)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


if __name__ == "__main__":
    main()
