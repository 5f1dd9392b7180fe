"""Trainer throughput: packing vs padding, or the transformers vs the torchtitan model.

    python bench/train.py [--seqs 64] [--steps 3] [--hidden 256 --layers 4] [--compare packing|impl|share]
    python bench/train.py --compare share --model ~/.cache/rlvr/models/SmolLM2-135M-Instruct-Q4_1

Responses are drawn from a long-tailed (log-normal) length distribution, as RL rollouts
are: most answers short, a few run to the generation limit. Padded micro-batches pay for
the longest sequence in each; packed ones (first-fit-decreasing under a token budget) pay
only for real tokens. Both modes train the same model from the same weights on the same
batch; tokens/s counts real (non-padding) tokens per second of `update_policy` (rlvr/trainer/step.py) wall
time (it includes the no-grad pass that recomputes pi_old). Prints one line per mode and
the ratio.

`--compare impl` trains the same model (same HF weights) on the same packed batch with
`model.impl = "hf"` and `"torchtitan"`, alternating the two each timed step so machine load
hits both alike, and prints torchtitan / transformers.

`--compare share` trains on GRPO's layout (`--group` responses per prompt) with
`trainer.share_prompts` off and on, alternated, and prints shared / plain speed; tokens/s counts
the sequences' tokens in both, so the ratio is the step-time ratio. `--model DIR` trains that
folder (a real model) instead of the built tiny one.

`--compare lora` trains the same model in full and with LoRA adapters (`--lora-rank`, all
linear layers), alternated the same way, and prints LoRA / full step speed, the trainer state
each holds (parameters + gradients + AdamW states, counted from the tensors) and the peak RSS
of a process running each alone (two subprocesses of this script, `--memory-of`).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlvr.trainer.step import update_policy


def skewed_batch(n: int, *, seed: int, max_response: int, vocab: int, group: int = 1):
    """`n` sequences; `group` > 1 repeats each prompt that many times (GRPO's samples of a prompt)."""
    from rlvr.trainer.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(16, 65, (n,), generator=g)
    if group > 1:
        prompt_lens = prompt_lens[torch.arange(n) // group * group]
    # log-normal: median ~40 tokens, long tail clipped at max_response
    response_lens = torch.exp(torch.randn(n, generator=g) * 1.0 + 3.7).clamp(4, max_response).long()
    prompts = [torch.randint(4, vocab, (int(k),), generator=g).tolist() for k in prompt_lens]
    if group > 1:
        prompts = [prompts[i // group * group] for i in range(n)]
    responses = [torch.randint(4, vocab, (int(k),), generator=g).tolist() for k in response_lens]
    advantages = torch.randn(n, generator=g).tolist()
    return TrainBatch.from_sequences(prompts, responses, advantages=advantages, group_ids=[i // 8 for i in range(n)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode (after one warm-up step)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--max-response", type=int, default=512)
    parser.add_argument("--micro-batch-size", type=int, default=8, help="sequences per padded micro-batch")
    parser.add_argument("--max-tokens", type=int, default=2048, help="token budget of a packed micro-batch")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    parser.add_argument("--compare", choices=["packing", "impl", "lora", "share"], default="packing")
    parser.add_argument("--group", type=int, default=8, help="share: responses per prompt")
    parser.add_argument("--model", type=Path, help="train this model folder instead of the built tiny one")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--memory-of", choices=["full", "lora"], help=argparse.SUPPRESS)  # one mode's peak RSS
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from rlvr.recipe.schema import AlgorithmConfig, LoraConfig, ModelConfig, TrainerConfig
    from rlvr.tiny import build_tiny_model_dir
    from rlvr.trainer.actor import Actor

    model_dir = args.model or Path(tempfile.gettempdir()) / f"rlvr-bench-train-h{args.hidden}-l{args.layers}"
    if args.model is None:
        build_tiny_model_dir(model_dir, hidden_size=args.hidden, layers=args.layers, heads=4, kv_heads=2,
                             max_positions=1024)  # fmt: skip
    group = args.group if args.compare == "share" else 1
    batch = skewed_batch(args.seqs, seed=0, max_response=args.max_response, vocab=90, group=group)
    lens = batch.seq_lens.float()
    real = int(lens.sum())
    padded_cost = sum(int(chunk.max()) * len(chunk) for chunk in batch.seq_lens.split(args.micro_batch_size))
    print(
        f"batch: {args.seqs} seqs, {real} tokens, seq len median {lens.median():.0f} / mean {lens.mean():.0f} / "
        f"max {lens.max():.0f}; padded micro-batches of {args.micro_batch_size} hold {padded_cost} slots "
        f"({real / padded_cost:.0%} real)"
    )
    algorithm = AlgorithmConfig(preset="dapo")  # no reference model: the trainer's own cost only

    def build(*, packing: bool, impl: str, lora: int = 0, share: bool = False) -> Actor:
        trainer = TrainerConfig(
            strategy="none", lr=1e-5, packing=packing, micro_batch_size=args.micro_batch_size,
            max_tokens_per_micro_batch=args.max_tokens, lora=LoraConfig(rank=lora), share_prompts=share,
        )  # fmt: skip
        model = ModelConfig(path=str(model_dir), dtype="float32", impl=impl)  # pyright: ignore[reportArgumentType]
        return Actor.build(model, trainer, algorithm, total_steps=args.steps + 1, device=torch.device("cpu"))

    if args.memory_of:
        actor = build(packing=True, impl="hf", lora=args.lora_rank if args.memory_of == "lora" else 0)
        for _ in range(2):
            update_policy(actor, batch)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return
    # Each mode's peak RSS alone, first: a child forked from this process once it holds both actors
    # would start from its high-water mark (Linux keeps ru_maxrss across fork and exec).
    rss = {name: peak_rss_alone(name) for name in ("full", "lora")} if args.compare == "lora" else {}
    modes = {"padded": (False, "hf", 0, False), "packed": (True, "hf", 0, False)}
    if args.compare == "impl":
        modes = {"hf": (True, "hf", 0, False), "torchtitan": (True, "torchtitan", 0, False)}
    if args.compare == "lora":
        modes = {"full": (True, "hf", 0, False), "lora": (True, "hf", args.lora_rank, False)}
    if args.compare == "share":
        modes = {"plain": (True, "hf", 0, False), "shared": (True, "hf", 0, True)}
    actors = {
        name: build(packing=packing, impl=impl, lora=lora, share=share)
        for name, (packing, impl, lora, share) in modes.items()
    }
    n_params = sum(p.numel() for p in next(iter(actors.values())).model.parameters())
    rates: dict[str, list[float]] = {name: [] for name in actors}
    for actor in actors.values():
        update_policy(actor, batch)  # warm-up
    for _ in range(args.steps):
        for name, actor in actors.items():
            start = time.perf_counter()
            update_policy(actor, batch)
            rates[name].append(real / (time.perf_counter() - start))
    results = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        print(f"{name:>10}: {results[name]:8.0f} tokens/s (median of {args.steps}; runs {[round(x) for x in r]})")
    first, second = list(results)
    paired = statistics.median(b / a for a, b in zip(rates[first], rates[second], strict=True))
    label = {"packing": "packing speed-up", "impl": "torchtitan / transformers", "lora": "LoRA / full speed",
             "share": f"shared / plain prompts ({group} responses each)"}  # fmt: skip
    print(
        f"model: {n_params / 1e6:.1f}M params, fp32 CPU, {torch.get_num_threads()} threads; "
        f"{label[args.compare]}: {results[second] / results[first]:.2f}x (median of per-step ratios, each pair "
        f"timed back to back: {paired:.2f}x)"
    )
    if args.compare == "lora":
        state = {name: trainer_state_bytes(actor) for name, actor in actors.items()}
        print(
            f"trainer state (params + grads + AdamW): full {state['full'] / 1e6:.1f} MB, LoRA rank {args.lora_rank} "
            f"{state['lora'] / 1e6:.1f} MB ({state['lora'] / state['full']:.2f}x); peak RSS alone: full "
            f"{rss['full'] / 1e6:.0f} MB, LoRA {rss['lora'] / 1e6:.0f} MB ({rss['lora'] / rss['full']:.2f}x)"
        )


def trainer_state_bytes(actor) -> int:
    """Parameters, one gradient per trainable parameter, and the optimizer's state tensors."""
    params = sum(p.numel() * p.element_size() for p in actor.model.parameters())
    grads = sum(p.numel() * p.element_size() for p in actor.model.parameters() if p.requires_grad)
    states = sum(
        t.numel() * t.element_size()
        for state in actor.optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    return params + grads + states


def peak_rss_alone(mode: str) -> int:
    """This script's peak RSS training one mode (two steps) in a fresh process."""
    argv = [sys.executable, __file__, *sys.argv[1:], "--memory-of", mode]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
