"""Curves of a run (or several) as one PNG: held-out eval per domain and train reward per domain.

    python scripts/plot_curves.py runs/smollm2_mix --out docs/img/smollm2_mix.png
    python scripts/plot_curves.py runs/a runs/b --label embedded --label vllm --out cmp.png

Reads each run directory's metrics.jsonl (the loop's own log, one row per step and per eval), so
it plots what the dashboard and TensorBoard showed; the last row of a step wins (a resumed run
logs a step once). Eval is `eval/reward/<domain>/mean` (greedy on the held-out rows; step 0 is
`experiment.eval_at_start`), train reward is `reward/<domain>/mean`. Needs matplotlib (the `gym`
extra brings it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows_by_step(run: Path) -> dict[int, dict]:
    path = run / "metrics.jsonl" if (run / "metrics.jsonl").exists() else next(run.glob("*/metrics.jsonl"))
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "step" in row:
            steps.setdefault(int(row["step"]), {}).update(row)
    return dict(sorted(steps.items()))


def series(steps: dict[int, dict], prefix: str) -> dict[str, tuple[list[int], list[float]]]:
    """domain -> (steps, values) for keys `<prefix><domain>/mean`."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for step, row in steps.items():
        for key, value in row.items():
            if key.startswith(prefix) and key.endswith("/mean") and key.count("/") == prefix.count("/") + 1:
                xs, ys = out.setdefault(key[len(prefix) : -len("/mean")], ([], []))
                xs.append(step)
                ys.append(float(value))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (or their parent)")
    parser.add_argument("--label", action="append", default=[], help="one per run (default: the folder name)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--title", default="")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_eval, ax_train) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = ["-", "--", ":", "-."]  # one per run; one colour per domain in both panels
    colours: dict[str, str] = {}
    for k, run in enumerate(args.runs):
        label = args.label[k] if k < len(args.label) else run.name
        steps = rows_by_step(run)
        for ax, prefix, marker in ((ax_eval, "eval/reward/", "o"), (ax_train, "reward/", "")):
            for name, (xs, ys) in sorted(series(steps, prefix).items()):
                colour = colours.setdefault(name, f"C{len(colours)}")
                text = f"{name} ({label})" if len(args.runs) > 1 else name
                ax.plot(xs, ys, styles[k % 4], color=colour, marker=marker or None, label=text)
    ax_eval.set(title="held-out eval (greedy)", xlabel="step", ylabel="accuracy", ylim=(0, 1))
    ax_train.set(title="train reward (samples of the step)", xlabel="step", ylabel="mean reward", ylim=(0, 1))
    for ax in (ax_eval, ax_train):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
