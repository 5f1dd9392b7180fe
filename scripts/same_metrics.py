"""Are two runs' per-step learning metrics bit-identical? `python scripts/same_metrics.py RUN_A RUN_B [NEW ...]`.

Compares every metric of metrics.jsonl except wall-clock ones (time, latencies, throughput, idle
fractions, seconds): a refactor that keeps behaviour keeps rewards, loss, entropy and counts exactly.
`mismatch_kl` alone may differ below 1e-9: the engine's log-probs of the same tokens move at 1e-14 with
how continuous batching happened to group the rows (two runs of one commit differ that much).
Metrics whose names start with a NEW prefix may exist in RUN_B only (a change that adds metrics).
Exit 1 with the first differences printed, else one line saying how many values matched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMING = ("time", "latency", "per_s", "throughput", "idle_frac", "seconds", "_s")
NOISE = {"mismatch_kl": 1e-9}


def same(key: str, x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, float) and key in NOISE:
        return abs(x - y) < NOISE[key]
    return x == y


def learning_metrics(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not any(t in k for t in TIMING)} for row in rows]


def main(a: str, b: str, *new: str) -> int:
    left, right = learning_metrics(Path(a)), learning_metrics(Path(b))
    right = [{k: v for k, v in row.items() if k in left_row or not k.startswith(new)}
             for row, left_row in zip(right, left + [{}] * len(right), strict=False)]  # fmt: skip
    diffs = [f"step {x.get('step')}: {k} {x.get(k)!r} != {y.get(k)!r}"
             for x, y in zip(left, right, strict=False) for k in sorted(x.keys() | y.keys()) if not same(k, x.get(k), y.get(k))]  # fmt: skip
    if len(left) != len(right):
        diffs.insert(0, f"{len(left)} steps != {len(right)} steps")
    if diffs:
        print("\n".join(diffs[:20]))
        return 1
    print(f"identical: {sum(len(r) for r in left)} values over {len(left)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
