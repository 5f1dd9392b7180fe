"""Weight sync throughput: `BroadcastSync.push` end to end vs a raw gloo broadcast of the same bytes.

    python bench/sync.py                         # ~70M-param Qwen3 (hidden 768, 8 layers), fp32
    python bench/sync.py --hidden 512 --layers 8 --bucket-mb 64 --repeats 5
    python bench/sync.py --size-gb 1.4 --repeats 3   # real sizes: layers chosen to reach 1.4 GB
    python bench/sync.py --size-gb 6 --repeats 2 --raw-only --raw-chunk-mb 1024   # ~3.3x that in free RAM
    python bench/sync.py --size-gb 1.4 --trainer fsdp2 --bucket-mb 16 --baseline-src /tmp/before --rounds 3

Two processes: this one (trainer rank 0, one trainer rank: the FSDP2 gather is not what
is measured; its model keeps its weights in one arena, as the single-process trainer
does) and an embedded server it starts from this same file (`--serve`), the real
`rlvr.server.routes` app plus bench-only routes: `/bench_raw` receives N bytes into a
preallocated buffer over the *same* update group, and `/bench_settle` waits for the
server's background rebuild of its oneDNN weight copies, so that work never slows a
baseline. Both numbers cross the same sockets between the same two processes; the
ratio is the protocol's overhead: HTTP calls (pause, flush, one update per bucket,
resume) and the server's landing of the bucket in its weights. The raw baseline sends
the weights themselves (a never-written buffer would send the kernel's zero page from
cache and flatter it). `/bench_raw` also times one broadcast per tensor into fresh and
into preallocated tensors (the floor of the `per_tensor` wire, `--wire-format per_tensor`
to sync with it). Each number is the best of `--repeats` (the CPU is shared). Prints
GB/s for each and the ratios. Each repeat also pushes with `sync.verify = "off"` (before or after
the verified push, alternating): what verification adds to a push is the difference (the trainer's
XXH3-128 of every tensor sent, the engine's of every weight it serves, the compare); each verified
push must report `sync/verified_engines` = 1, so the cost is that of a verification that happened.

`--baseline-src OLD_TREE` (e.g. `git worktree add /tmp/before HEAD` before a change) runs
`--rounds` rounds of the same measurement, before (`PYTHONPATH=OLD_TREE`) then after (this
tree), each in fresh processes, and prints every round and the ranges, the verify cost included:
on a shared CPU one pair of runs says little, alternation keeps the load alike for both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def serve(model_dir: str, port: int) -> None:
    """The server process: `rlvr serve`'s app plus /bench_raw."""
    import torch
    from aiohttp import web

    from rlvr.server.embedded import EmbeddedEngine
    from rlvr.server.routes import ENGINE_KEY, create_app

    engine = EmbeddedEngine(model_dir, max_batch=1, device="cpu", max_seq_len=64)
    buffers: dict[int, torch.Tensor] = {}
    preallocated: list[torch.Tensor] = []

    def receive(nbytes: int, group_name: str, specs: list | None, reuse: bool, chunk: int) -> None:
        import torch.distributed as dist

        from rlvr.sync.group import receive_broadcast, receive_into, torch_dtype

        if specs and reuse:  # the per-tensor wire format's floor: no allocation, no copy
            if not preallocated:
                preallocated.extend(torch.empty(shape, dtype=torch_dtype(dt)) for _, dt, shape in specs)
            receive_into(engine.weights.groups[group_name], preallocated)
            return
        if specs:  # the server's old update, minus the copy into the model
            names, dtypes, shapes = zip(*specs, strict=True)
            receive_broadcast(engine.weights.groups[group_name], names, dtypes, shapes, device="cpu")
            return
        # One message, or (--raw-chunk-mb, at sizes where a second copy of the weights does not fit
        # beside the server's) consecutive chunks into one reused buffer.
        step = chunk or nbytes
        buffer = buffers.setdefault(step, torch.empty(step, dtype=torch.uint8))
        options = dist.BroadcastOptions()
        options.rootRank = 0
        for start in range(0, nbytes, step):
            part = buffer[: min(step, nbytes - start)]
            engine.weights.groups[group_name].broadcast([part], options).wait()

    async def bench_raw(request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.to_thread(
            receive,
            int(body["nbytes"]),
            str(body["group_name"]),
            body.get("specs"),
            bool(body.get("reuse")),
            int(body.get("chunk") or 0),
        )
        return web.json_response({"success": True})

    async def bench_settle(request: web.Request) -> web.Response:
        # The last sync's background repack of the engine's oneDNN weight copies must not
        # slow the baseline that follows it.
        await asyncio.to_thread(engine.backend.wait_packed)
        return web.json_response({"success": True})

    app = create_app(engine)
    app.router.add_post("/bench_raw", bench_raw)
    app.router.add_post("/bench_settle", bench_settle)
    assert app[ENGINE_KEY] is engine
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args: argparse.Namespace) -> dict:
    """Build the model, start the server, push `--repeats` times (after a warm-up push) with the
    raw baselines in between; every time in seconds."""
    import shutil

    import aiohttp
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlvr.recipe.schema import SyncConfig
    from rlvr.rollout.sglang import SGLangClient
    from rlvr.sync import make_weight_sync
    from rlvr.sync.broadcast import BroadcastSync
    from rlvr.tiny import build_tiny_model_dir
    from rlvr.trainer.weights import iter_full_weights
    from rlvr.weight_arena import build_weight_arena

    torch.set_num_threads(1)
    if args.size_gb:  # a Qwen3 layer (heads 8, kv 4, MLP 4x): 4 h^2 attention + 12 h^2 MLP params, fp32
        per_layer = (2 * args.hidden**2 + 2 * args.hidden * args.hidden // 2 + 12 * args.hidden**2) * 4
        args.layers = max(1, round(args.size_gb * 1e9 / per_layer))
    tmp = Path(tempfile.mkdtemp(prefix="rlvr-bench-sync-"))
    model_dir = build_tiny_model_dir(tmp / "model", hidden_size=args.hidden, layers=args.layers, heads=8, kv_heads=4)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if args.trainer == "fsdp2":
        from rlvr.trainer.model import shard_model

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        model = shard_model(model, strategy="fsdp2", device=torch.device("cpu"))
        arena = None
    else:
        arena = build_weight_arena(model)  # what the single-process trainer (strategy "none") does to its model
    params = sum(p.numel() for p in model.parameters())
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(model_dir), str(port)],
        env=env,
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        client = SGLangClient([url], timeout_s=120)
        asyncio.run(client.wait_ready(timeout_s=180))
        cfg = SyncConfig(bucket_mb=int(args.bucket_mb), timeout_s=120, wire_format=args.wire_format)
        sync = make_weight_sync(cfg, model=model, client=client)
        assert isinstance(sync, BroadcastSync)
        nbytes = sync.plan.total_bytes
        times: dict[str, list[float]] = {
            "sync": [], "transfer": [], "raw": [], "fresh": [], "floor": [], "verify": [], "verify_engine": [],
            "verified": [],
            "unverified": [],
        }  # fmt: skip
        # The same bytes: the weights themselves, flat. (A never-written `torch.empty` buffer
        # would send the kernel's shared zero page from cache and flatter the baseline.)
        # The arena is those bytes in that order already: no second host copy at large sizes.
        raw = arena if arena is not None and arena.numel() == nbytes else None
        if raw is None:
            raw = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in iter_full_weights(model)])
        assert raw.numel() == nbytes
        options = dist.BroadcastOptions()
        options.rootRank = 0

        tensors = [t for _, t in iter_full_weights(model)]
        specs = [[s.name, s.dtype, list(s.shape)] for s in sync.plan.specs]

        chunk = int(args.raw_chunk_mb * 1e6)

        def send(group, per_tensor: bool) -> None:
            chunks = [raw[i : i + chunk] for i in range(0, nbytes, chunk)] if chunk else [raw]
            parts = tensors if per_tensor else chunks
            for part in parts:  # in order, one at a time: the receiver reuses one chunk buffer
                group.broadcast([part], options).wait()

        async def raw_once(per_tensor: bool = False, reuse: bool = False) -> float:
            membership = sync.membership  # rank 0's: this process is the one trainer rank
            assert membership is not None
            group = membership.group
            payload = {
                "nbytes": nbytes,
                "group_name": membership.label,
                "specs": specs if per_tensor else None,
                "reuse": reuse,
                "chunk": 0 if per_tensor else chunk,
            }
            async with aiohttp.ClientSession() as session:
                settle = await session.post(url + "/bench_settle")
                assert settle.status == 200, await settle.text()
                start = time.perf_counter()
                request = asyncio.ensure_future(session.post(url + "/bench_raw", json=payload))
                await asyncio.to_thread(send, group, per_tensor)
                response = await request
                assert response.status == 200, await response.text()
                return time.perf_counter() - start

        def unverified_push(version: int) -> float:
            """The same push with `sync.verify = "off"`: the baseline of what verifying costs."""
            mode, observe = sync.verifier.mode, sync.plan.observe
            sync.verifier.mode, sync.plan.observe = "off", None
            try:
                return sync.push(version=version)["sync/seconds"]
            finally:
                sync.verifier.mode, sync.plan.observe = mode, observe

        for version in range(args.repeats + 1):  # the first push builds the group: a warm-up
            if version and version % 2:  # alternate which of the pair goes first
                times["unverified"].append(unverified_push(1000 + version))
            metrics = sync.push(version=version)
            engine_s = sync.verifier.engine_seconds  # rank 0's (this process); the next push resets it
            verified = metrics.get("sync/verified_engines", -1.0)  # -1: a tree from before the count
            assert verified in (1.0, -1.0), f"push {version}: {verified} engines verified, not 1"
            if version and not version % 2:
                times["unverified"].append(unverified_push(1000 + version))
            if version:
                times["sync"].append(metrics["sync/seconds"])
                times["transfer"].append(metrics["sync/transfer_seconds"])
                times["verify"].append(metrics["sync/verify_s"])
                times["verify_engine"].append(engine_s)
                times["verified"].append(verified)
                times["raw"].append(asyncio.run(raw_once()))
                if not args.raw_only:
                    times["fresh"].append(asyncio.run(raw_once(per_tensor=True)))
                    times["floor"].append(asyncio.run(raw_once(per_tensor=True, reuse=True)))
        sync.close()
        asyncio.run(client.close())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"params": params, "nbytes": nbytes, **times}


def report(args: argparse.Namespace, result: dict, label: str = "") -> None:
    gb = result["nbytes"] / 1e9
    best = {key: min(result[key]) for key in ("sync", "transfer", "raw", "fresh", "floor") if result[key]}
    if not label:
        print(
            f"model: {result['params'] / 1e6:.1f}M params, fp32, {gb * 1e3:.0f} MB, buckets of {args.bucket_mb:g} MB, "
            f"{args.wire_format} wire, trainer strategy {args.trainer}"
        )
    head = f"{label}: " if label else ""
    print(
        f"{head}raw gloo broadcast (same bytes, same processes): {gb / best['raw']:.2f} GB/s ({best['raw'] * 1e3:.0f} ms)"
    )
    if label:  # a --baseline-src round: the headline numbers and the verify cost
        print(f"{head}sync end to end (pause..resume): {gb / best['sync']:.2f} GB/s ({best['sync'] * 1e3:.0f} ms)")
        print(f"{head}ratio end to end / raw: {best['raw'] / best['sync']:.0%}")
        print("\n".join(f"{head}{line}" for line in verify_cost(result).splitlines()))
        return
    if "floor" in best:
        print(f"per-tensor broadcast into fresh tensors (the old receive, no load): {gb / best['fresh']:.2f} GB/s")
        print(f"per-tensor broadcast into preallocated tensors (wire floor): {gb / best['floor']:.2f} GB/s")
    print(f"sync end to end (pause..resume):               {gb / best['sync']:.2f} GB/s ({best['sync'] * 1e3:.0f} ms)")
    print(
        f"sync transfer only (buckets, no pause/resume):  {gb / best['transfer']:.2f} GB/s ({best['transfer'] * 1e3:.0f} ms)"
    )
    print(
        f"ratio end to end / raw: {best['raw'] / best['sync']:.0%}   transfer / raw: {best['raw'] / best['transfer']:.0%}"
    )
    paired = sorted(
        r / s for r, s in zip(result["raw"], result["sync"], strict=True)
    )  # each repeat with its own baseline
    print(f"ratio end to end / raw per repeat: {paired[0]:.0%}..{paired[-1]:.0%} over {len(paired)}")
    print(verify_cost(result))
    if "floor" in best:
        print(
            f"ratio end to end / per-tensor floor: {best['floor'] / best['sync']:.0%}   "
            f"floor / raw: {best['raw'] / best['floor']:.0%}"
        )


def verify_cost(result: dict) -> str:
    """Two lines: the verified push against the unverified one (alternated), and verify's own time."""
    share = sorted(v / s for v, s in zip(result["verify"], result["sync"], strict=True))  # within each push
    added = sorted(s / u - 1 for s, u in zip(result["sync"], result["unverified"], strict=True))
    return (
        f"push verified / unverified (sync.verify auto / off, alternated): {min(result['sync']) * 1e3:.0f} / "
        f"{min(result['unverified']) * 1e3:.0f} ms best, verifying adds {min(result['sync']) / min(result['unverified']) - 1:+.1%} "
        f"best vs best; per pair {added[0]:+.1%}..{added[-1]:+.1%}, median {added[len(added) // 2]:+.1%}\n"
        f"verify's own time (sync/verify_s: the trainer's XXH3-128 of what it sends, mostly while buckets travel, "
        f"+ the engine's answer + compare): {min(result['verify']) * 1e3:.0f} ms best, {share[0]:.1%}..{share[-1]:.1%} "
        f"of the push; of it, the engine's answer {min(result['verify_engine']) * 1e3:.0f}-"
        f"{max(result['verify_engine']) * 1e3:.0f} ms"
    )


def compare(args: argparse.Namespace, argv: list[str]) -> None:
    """`--rounds` rounds of (before, after), each a fresh pair of processes: before runs with
    `PYTHONPATH=--baseline-src`, after with this tree; prints each round and the ranges."""
    import json

    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for round_ in range(1, args.rounds + 1):
        for label, path in (("before", args.baseline_src.resolve()), ("after", ROOT)):
            env = {**os.environ, "PYTHONPATH": str(path)}
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), *argv, "--json"],
                env=env,
                capture_output=True,
                text=True,
                cwd=path,
            )
            lines = [line for line in out.stdout.splitlines() if line.startswith("JSON ")]
            if not lines:
                raise SystemExit(f"{label} run failed: {out.stderr[-3000:]}")
            runs[label].append(json.loads(lines[-1][5:]))
            report(args, runs[label][-1], f"round {round_} {label}")
    for label, results in runs.items():
        sync = sorted(min(r["sync"]) * 1e3 for r in results)
        raw = sorted(min(r["raw"]) * 1e3 for r in results)
        ratios = sorted(min(r["raw"]) / min(r["sync"]) for r in results)
        verify = sorted(min(r["verify"]) * 1e3 for r in results)
        engine = sorted(min(r["verify_engine"]) * 1e3 for r in results)
        added = sorted(s / u - 1 for r in results for s, u in zip(r["sync"], r["unverified"], strict=True))
        print(
            f"{label}: sync {sync[0]:.0f}..{sync[-1]:.0f} ms, raw {raw[0]:.0f}..{raw[-1]:.0f} ms, "
            f"end to end / raw {ratios[0]:.0%}..{ratios[-1]:.0%} over {len(results)} rounds; verify_s best "
            f"{verify[0]:.0f}..{verify[-1]:.0f} ms (engine's answer {engine[0]:.0f}..{engine[-1]:.0f} ms), verifying "
            f"adds {added[len(added) // 2]:+.1%} median per pair ({added[0]:+.1%}..{added[-1]:+.1%})"
        )


def lora(args: argparse.Namespace) -> None:
    """A LoRA policy's push, both ways, into the same server, alternated `--repeats` times: the
    adapters (`sync.lora = "adapter"`: a peft folder the engine merges into its base) against the
    merged full weights (`"merged"`, broadcast). Prints bytes, seconds (best and range) and ratios."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.recipe.schema import LoraConfig, SyncConfig
    from rlvr.rollout.factory import ServeClient
    from rlvr.sync import make_weight_sync
    from rlvr.tiny import build_tiny_model_dir
    from rlvr.trainer.lora import apply_lora

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="rlvr-bench-sync-lora-"))
    model_dir = build_tiny_model_dir(tmp / "model", hidden_size=args.hidden, layers=args.layers, heads=8, kv_heads=4)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = apply_lora(model, LoraConfig(rank=args.lora, alpha=2.0 * args.lora), seed=0)
    with torch.no_grad():  # trained adapters: B is no longer zero
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.01)
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(model_dir), str(port)], env=env, stdout=log,
                            stderr=log)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    times: dict[str, list[float]] = {"adapter": [], "merged": []}
    sizes: dict[str, float] = {}
    try:
        client = ServeClient([url], timeout_s=120)
        asyncio.run(client.wait_ready(timeout_s=180))
        syncs = {
            mode: make_weight_sync(
                SyncConfig(lora=mode, bucket_mb=int(args.bucket_mb), timeout_s=120), model=model, client=client,  # pyright: ignore[reportArgumentType]
                run_dir=tmp,
            )
            for mode in ("adapter", "merged")
        }  # fmt: skip
        version = 0
        for repeat in range(args.repeats + 1):  # the first round warms both up
            for mode, sync in syncs.items():
                version += 1
                start = time.perf_counter()
                metrics = sync.push(version=version)
                if repeat:
                    times[mode].append(time.perf_counter() - start)
                    sizes[mode] = metrics["sync/gb"] * 1e9
        for sync in syncs.values():
            sync.close()
        asyncio.run(client.close())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    params = sum(p.numel() for n, p in model.named_parameters() if ".lora_" not in n)
    print(f"model: {params / 1e6:.1f}M params (hidden {args.hidden}, {args.layers} layers), LoRA rank {args.lora}")
    for mode in ("merged", "adapter"):
        t = times[mode]
        print(f"{mode:>8}: {sizes[mode] / 1e6:8.2f} MB per push, {min(t):.3f} s best ({min(t):.3f}-{max(t):.3f} s)")
    print(
        f"adapter / merged: {sizes['adapter'] / sizes['merged']:.4f}x the bytes, "
        f"{min(times['adapter']) / min(times['merged']):.2f}x the time (best of {args.repeats}, alternated)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--bucket-mb", type=float, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--size-gb", type=float, default=None, help="pick --layers so the fp32 weights are about this many GB"
    )
    parser.add_argument("--wire-format", default="flattened_bucket", choices=["flattened_bucket", "per_tensor"])
    parser.add_argument(
        "--trainer",
        default="none",
        choices=["none", "fsdp2"],
        help="the trainer's strategy: `none` keeps the weights in one arena; `fsdp2` shards them "
        "(one rank, as the quickstart does), so each push gathers and packs every tensor",
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="a source tree (its rlvr/, e.g. `git worktree add /tmp/before HEAD`) to measure as before, "
        "alternating with this tree for --rounds rounds",
    )
    parser.add_argument("--rounds", type=int, default=3, help="before/after rounds with --baseline-src")
    parser.add_argument(
        "--raw-only", action="store_true",
        help="only the raw baseline (the per-tensor ones receive a second copy of the weights into the server)",
    )  # fmt: skip
    parser.add_argument(
        "--raw-chunk-mb", type=float, default=0,
        help="send the raw baseline in chunks of this size into one reused buffer (0: one message of every byte)",
    )  # fmt: skip
    parser.add_argument(
        "--lora", type=int, default=0, metavar="RANK",
        help="LoRA: push a rank-RANK adapter (all linear layers) against the merged full weights of the same model",
    )  # fmt: skip
    parser.add_argument("--serve", nargs=2, metavar=("MODEL_DIR", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a --baseline-src round's child
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    if args.baseline_src:
        argv = [a for a in sys.argv[1:] if a != "--json"]
        drop = {"--baseline-src", "--rounds"}
        argv = [a for i, a in enumerate(argv) if a not in drop and (i == 0 or argv[i - 1] not in drop)]
        argv = [a for a in argv if not a.startswith(("--baseline-src=", "--rounds="))]
        compare(args, argv)
        return
    if args.lora:
        lora(args)
        return
    result = measure(args)
    if args.json:
        import json

        print("JSON", json.dumps(result))
        return
    report(args, result)


if __name__ == "__main__":
    main()
