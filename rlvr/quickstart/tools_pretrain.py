"""Build the tools quickstart's policy: a tiny char-level Qwen3 that calls tools only sometimes.

    python -m rlvr.quickstart.tools_pretrain recipes/tools

writes `policy/` and `data/` (rows and the search corpus). The warm-up episodes call the
tool in `--call` of the cases (a `<code>` product or a `<search>` for the entity, then the
answer copied from the `<result>`), and otherwise answer straight away with a guess, so the
starting policy is right only when it happens to call. The tool answers in the warm-up are
the real tools' answers, rendered exactly as an episode appends them, and they are not
trained on (loss mask 0, as in RL). Deterministic for a given seed and thread count (the
shipped policy: `OMP_NUM_THREADS=1`, 1200 steps, 13 min on a loaded 2-core machine). Fewer
steps are not enough: at 450 the policy had not learned to copy digits (math reward 0).
"""

from __future__ import annotations

import argparse
import functools
import random
import time
from pathlib import Path

from rlvr.quickstart.pretrain import Answer, sft
from rlvr.quickstart.tool_tasks import fact_call, guess, math_answer, math_call, rows, write_tools_data

MODEL_SHAPE = {"hidden_size": 128, "layers": 3, "heads": 4, "kv_heads": 2, "max_positions": 256}
SEARCH_TOP_K = 1  # the recipe's search_top_k: the warm-up must see what the tool returns in RL


def tool_episode(domain: str, row: dict, *, search) -> list[tuple[str, bool]]:
    """call (trained), the tool's rendered answer (not trained), the copied answer (trained)."""
    from rlvr.tools.formats import TagsFormat
    from rlvr.tools.search import format_hits

    if domain == "math":
        call, output = math_call(row), str(row["ground_truth"])
        answer = math_answer(output)
    else:
        call = fact_call(row)
        output = format_hits(search(call.removeprefix("<search>").removesuffix("</search>"), SEARCH_TOP_K))
        answer = str(row["ground_truth"])
    return [(call, True), (TagsFormat({}).render(output), False), (answer, True)]


def policy_examples(data_dir: Path, *, seed: int, count: int, call: float) -> list[tuple[str, Answer]]:
    from rlvr.tools.search import SearchIndex

    search = functools.cache(SearchIndex(data_dir / "corpus.jsonl").search)  # 200 entities, 10k queries
    rng = random.Random(seed)
    pool = {
        "math": rows("math", "warmup", seed=seed, count=count),
        "facts": rows("facts", "warmup", seed=seed, count=count),
    }
    examples: list[tuple[str, Answer]] = []
    for i in range(count):
        domain = "math" if i % 2 else "facts"
        row = pool[domain][i]
        if rng.random() < call:
            examples.append((row["prompt"], tool_episode(domain, row, search=search)))
        else:
            examples.append((row["prompt"], guess(domain, row, rng)))
    return examples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--call", type=float, default=0.5, help="share of warm-up episodes that call the tool")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    write_tools_data(args.out_dir / "data", seed=args.seed)
    start = time.time()
    loss = sft(
        policy_examples(args.out_dir / "data", seed=args.seed, count=20_000, call=args.call),
        args.out_dir / "policy",
        seed=args.seed,
        steps=args.steps,
        batch=args.batch,
        lr=3e-3,
        shape=MODEL_SHAPE,
        log_every=100,
    )
    print(f"policy: loss {loss:.3f} in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
