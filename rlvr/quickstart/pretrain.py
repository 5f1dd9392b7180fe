"""Build the quickstart's policy (and judge) models: tiny char-level Qwen3s warmed up by SFT.

    python -m rlvr.quickstart.pretrain recipes/quickstart

writes `policy/`, `judge/` and the data files. The policy is trained on *noisy* answers
(`--correct` share right, the rest plausible but wrong), so it starts right only part
of the time; the judge is trained to answer YES/NO on reference matches and is served by
`rlvr serve` as the quickstart's LLM judge. Deterministic for a given seed.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path

from rlvr.quickstart.tasks import OPPOSITES, ROWS, write_quickstart_data, wrong_answer

MODEL_SHAPE = {"hidden_size": 128, "layers": 3, "heads": 4, "kv_heads": 2, "max_positions": 512}
JUDGE_TEMPLATE = "ref: {reference}\nans: {answer}\nsame?"


def policy_examples(*, seed: int, count: int, correct: float) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    examples = []
    for i in range(count):
        domain = rng.choice(sorted(ROWS))
        make, answer = ROWS[domain]
        row = make(rng, i)
        text = answer(row) if rng.random() < correct else wrong_answer(domain, row, rng)
        examples.append((row["prompt"], text))
    return examples


def judge_examples(*, seed: int, count: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = sorted(set(OPPOSITES) | set(OPPOSITES.values()))
    examples = []
    for _ in range(count):
        reference = rng.choice(words)
        answer = reference if rng.random() < 0.5 else rng.choice(words)
        examples.append(
            (JUDGE_TEMPLATE.format(reference=reference, answer=answer), "YES" if answer == reference else "NO")
        )
    return examples


Answer = str | list[tuple[str, bool]]


def sft(
    examples: Sequence[tuple[str, Answer]],
    out_dir: Path,
    *,
    seed: int,
    steps: int,
    batch: int,
    lr: float,
    shape: dict | None = None,
    log_every: int = 0,
) -> float:
    """Train a fresh tiny model on prompt -> answer (loss on the answer and EOS only).

    An answer may be a list of (text, trained) pieces: a tool episode's tool output is given
    with trained = False, so the model learns to call and to read, never to write the answer
    of the tool itself (as RL masks those tokens)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rlvr.data.chat import render_prompt
    from rlvr.tiny import build_char_tokenizer, tiny_config

    torch.manual_seed(seed)
    tokenizer = build_char_tokenizer()
    config = Qwen3Config(**tiny_config(vocab_size=len(tokenizer), **(shape or MODEL_SHAPE)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    encoded = []
    for prompt, answer in examples:
        p = tokenizer(
            render_prompt([{"role": "user", "content": prompt}], tokenizer=tokenizer), add_special_tokens=False
        )
        ids, trained = list(p["input_ids"]), [False] * len(p["input_ids"])
        for text, train in [(answer, True)] if isinstance(answer, str) else answer:
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            trained += [train] * len(piece)
        encoded.append((ids + [tokenizer.eos_token_id], trained + [True]))
    pad_id: int = tokenizer.pad_token_id  # pyright: ignore[reportAssignmentType]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    loss_value = float("nan")
    for step in range(steps):
        chosen = [encoded[rng.randrange(len(encoded))] for _ in range(batch)]
        width = max(len(ids) for ids, _ in chosen)
        input_ids = torch.full((batch, width), pad_id)
        labels = torch.full((batch, width), -100)
        for row, (ids, trained) in enumerate(chosen):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, trained, strict=True)])
        logits = model(input_ids=input_ids, attention_mask=input_ids.ne(pad_id).long()).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 50) * (1 - step / steps) + lr * 0.05
        optimizer.step()
        loss_value = float(loss.detach())
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1}/{steps}: loss {loss_value:.3f}", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return loss_value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--correct", type=float, default=0.35, help="share of right answers in the warm-up data")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--judge-steps", type=int, default=600)
    args = parser.parse_args(argv)
    write_quickstart_data(args.out_dir / "data", seed=args.seed)
    start = time.time()
    loss = sft(
        policy_examples(seed=args.seed, count=20_000, correct=args.correct),
        args.out_dir / "policy",
        seed=args.seed,
        steps=args.steps,
        batch=64,
        lr=3e-3,
    )
    print(f"policy: loss {loss:.3f} in {time.time() - start:.0f}s")
    start = time.time()
    loss = sft(
        judge_examples(seed=args.seed + 1, count=20_000),
        args.out_dir / "judge",
        seed=args.seed + 1,
        steps=args.judge_steps,
        batch=64,
        lr=3e-3,
    )
    print(f"judge: loss {loss:.3f} in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
