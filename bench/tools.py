"""Tool latency: python tool calls vs a bare interpreter start, BM25 index build and query time.

    python bench/tools.py [--calls N] [--passages N] [--queries N]

The baseline (`subprocess.run([sys.executable, "-c", "pass"])`) is measured in the same run,
so the python tool's cost is reported as a ratio that means something on any machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlvr.tools.python import python_tool  # noqa: E402
from rlvr.tools.search import search_tool  # noqa: E402


async def bench_python(calls: int) -> tuple[float, float]:
    tool = python_tool(timeout_s=10)
    await tool.fn(code="print(1)")  # probe the isolation mode once
    start = time.perf_counter()
    for i in range(calls):
        await tool.fn(code=f"print({i} * 456)")
    per_call = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    for _ in range(calls):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    return per_call, (time.perf_counter() - start) / calls


async def bench_search(passages: int, queries: int) -> tuple[float, float]:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i in range(passages):
            f.write(json.dumps({"title": f"t{i}", "text": " ".join(rng.choice(words) for _ in range(40))}) + "\n")
    try:
        start = time.perf_counter()
        tool = search_tool(corpus=f.name, top_k=3)
        build = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(queries):
            await tool.fn(query=f"w{i} w{i + 7} w{i + 99}")
        return build, (time.perf_counter() - start) / queries
    finally:
        os.remove(f.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--passages", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=50)
    args = parser.parse_args()
    tool_s, bare_s = asyncio.run(bench_python(args.calls))
    print(f"python tool: {tool_s * 1000:.0f} ms/call; bare `python -c pass`: {bare_s * 1000:.0f} ms "
          f"(tool / bare = {tool_s / bare_s:.2f}x)")  # fmt: skip
    build_s, query_s = asyncio.run(bench_search(args.passages, args.queries))
    print(f"search: {args.passages} passages indexed in {build_s:.2f} s; {query_s * 1000:.1f} ms/query")


if __name__ == "__main__":
    main()
