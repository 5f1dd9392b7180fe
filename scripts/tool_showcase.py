"""The two tool showcases on a real model, each with its tool and without it, and their figures.

    python scripts/tool_showcase.py                        # both showcases, with and without the tool
    python scripts/tool_showcase.py --only python --steps 10 --set trainer.lr=3e-5
    python scripts/tool_showcase.py --only search --twin-only  # launch the twin, plot both
    python scripts/tool_showcase.py --plot-only            # redraw from the runs already there

Runs recipes/smollm2_python_tool.toml and recipes/smollm2_search_tool.toml one after the other
(the no-tool twin is the same recipe with `--set domains.NAME.tools=[]`), under `nice`, then reads
each run's metrics.jsonl: the greedy held-out eval (step 0 is `experiment.eval_at_start`), the tool
use of the training episodes (`tools/NAME/call_rate`, `calls_per_episode`, `errors`, `turns/NAME`),
the seconds per step, and from samples.jsonl the greedy answers of the first and last eval.
Writes docs/img/tool_showcase_{python,search}.png and RUNS/summary.json, and prints one table per
showcase. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Showcase:
    key: str
    recipe: str
    domain: str
    title: str


SHOWCASES = (
    Showcase("python", "recipes/smollm2_python_tool.toml", "products", "SmolLM2-135M, 3-digit products, Python tool"),
    Showcase("search", "recipes/smollm2_search_tool.toml", "mayors", "SmolLM2-135M, two-hop questions, search tool"),
)


def launch(show: Showcase, *, tool: bool, runs: Path, steps: int | None, overrides: list[str]) -> float:
    """One training run (with or without the tool); the wall seconds it took. Raises if it failed."""
    cmd = ["nice", sys.executable, "-m", "rlvr.cli", "launch", show.recipe]
    cmd += ["--set", f"experiment.name={run_name(show, tool=tool)}", "--set", f"experiment.output_dir={runs}"]
    if steps is not None:
        cmd += ["--set", f"experiment.max_steps={steps}"]
    if not tool:
        cmd += ["--set", f"domains.{show.domain}.tools=[]"]
    for item in overrides:
        cmd += ["--set", item]
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    return time.perf_counter() - start


def run_name(show: Showcase, *, tool: bool) -> str:
    return f"{show.key}_{'tool' if tool else 'notool'}"


def read_steps(run: Path) -> dict[int, dict]:
    """step -> the merged metrics rows of that step (a resumed run logs a step once)."""
    steps: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "step" in row:
            steps.setdefault(int(row["step"]), {}).update(row)
    return dict(sorted(steps.items()))


def summarize(show: Showcase, run: Path) -> dict:
    """The curve and the tool use of one run, as plain numbers."""
    steps = read_steps(run)
    d = show.domain
    evals = {s: r[f"eval/reward/{d}/accuracy"] for s, r in steps.items() if f"eval/reward/{d}/accuracy" in r}
    train = {s: r for s, r in steps.items() if f"reward/{d}/mean" in r}
    times = [r["time"] for r in steps.values() if "time" in r]
    return {
        "eval_accuracy": evals,
        "train_reward": {s: r[f"reward/{d}/mean"] for s, r in train.items()},
        # tool metrics exist only where the tool is on (a twin's unanswered blocks are no calls)
        **{name: {s: r[key] for s, r in train.items() if key in r} for name, key in tool_keys(d).items()},
        "seconds_per_step": (max(times) - min(times)) / max(len(train), 1) if len(times) > 1 else None,
        "greedy_examples": eval_examples(run),
    }


def eval_examples(run: Path) -> dict[int, list[str]]:
    """The first and last eval's logged greedy answers (samples.jsonl rows marked `eval`)."""
    path = run / "samples.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    by_step: dict[int, list[str]] = {}
    for row in rows:
        if row.get("eval"):
            by_step.setdefault(int(row["step"]), []).append(f"[reward {row['reward']}] {row['completion']}")
    steps = sorted(by_step)
    return {s: by_step[s] for s in dict.fromkeys(steps[:1] + steps[-1:])}  # one eval: listed once


def tool_keys(domain: str) -> dict[str, str]:
    return {
        "call_rate": f"tools/{domain}/call_rate",
        "calls_per_episode": f"tools/{domain}/calls_per_episode",
        "tool_errors": f"tools/{domain}/errors",
        "turns": f"turns/{domain}",
    }


def plot(show: Showcase, results: dict[str, dict], out: Path) -> None:
    """Held-out greedy accuracy with and without the tool, and the tool calls per training episode
    (two for a two-hop answer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, calls) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, res in results.items():
        xs = sorted(res["eval_accuracy"])
        acc.plot(xs, [res["eval_accuracy"][x] for x in xs], marker="o", label=label)
        xs = sorted(res["calls_per_episode"])
        if xs:
            calls.plot(xs, [res["calls_per_episode"][x] for x in xs], marker=".", label=label)
    acc.set(xlabel="step", ylabel="held-out accuracy (greedy)", ylim=(-0.02, 1.02), title=show.title)
    top = max([1.0] + [v for res in results.values() for v in res["calls_per_episode"].values()])
    calls.set(xlabel="step", ylabel="tool calls per episode", ylim=(-0.02, top + 0.05), title="tool calls (training)")
    acc.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def table(show: Showcase, results: dict[str, dict]) -> str:
    lines = [f"{show.key}: step -> eval accuracy (tool-call rate of that step's training episodes)"]
    for label, res in results.items():
        rate = res["call_rate"]
        cells = [
            f"{s}: {a:.3f}" + (f" ({rate.get(s, rate.get(s + 1, 0.0)):.2f})" if rate else "")
            for s, a in res["eval_accuracy"].items()
        ]
        sps = res["seconds_per_step"]
        lines.append(f"  {label:>9}: " + ", ".join(cells) + (f"  [{sps:.0f} s a step, evals included]" if sps else ""))
        for step, answers in res.get("greedy_examples", {}).items():
            lines += [f"    greedy at step {step}: {answer!r}" for answer in answers]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", choices=[s.key for s in SHOWCASES], action="append", help="one showcase (repeatable)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "tool_showcase", help="where the runs go")
    parser.add_argument("--steps", type=int, default=None, help="experiment.max_steps (default: the recipe's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="KEY=VALUE for every run")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--no-twin", action="store_true", help="launch only the runs with the tool")
    which.add_argument("--twin-only", action="store_true", help="launch only the no-tool twins")
    parser.add_argument("--plot-only", action="store_true", help="read and plot the runs already there")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img", help="where the figures go")
    args = parser.parse_args()

    chosen = [s for s in SHOWCASES if not args.only or s.key in args.only]
    summary_path = args.runs / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for show in chosen:
        results = {}
        for tool in (True, False):
            label = "with tool" if tool else "no tool"
            run = args.runs / run_name(show, tool=tool)
            wall = None
            if not (args.plot_only or (args.no_twin and not tool) or (args.twin_only and tool)):
                wall = launch(show, tool=tool, runs=args.runs, steps=args.steps, overrides=args.overrides)
            if (run / "metrics.jsonl").exists():
                results[label] = summarize(show, run) | {"wall_s": wall}
        summary[show.key] = results
        print(table(show, results))
        plot(show, results, args.img / f"tool_showcase_{show.key}.png")
    args.runs.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
