"""FSDP2 on 2 gloo ranks (torchrun) against a plain single-process actor, and exact resume.

This file is also the torchrun worker (`python -m torch.distributed.run ... <this file> --worker`):
one file holds the scenario and its checks. The worker trains the tiny Qwen3 on a fixed
synthetic batch with packing under a small token budget (ranks get different micro-batch
counts, so the dummy-forward path runs), two mini-batches per step and a KL-in-loss
reference model (the grpo preset), optionally saving or resuming a checkpoint.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvr.process import free_port
from rlvr.trainer.dist import exit_process
from rlvr.trainer.step import update_policy

STEPS = 4
SAVE_AT = 2


def synthetic_batch():
    from rlvr.trainer.batch import TrainBatch

    g = torch.Generator().manual_seed(1234)
    n = 8
    prompts = [torch.randint(4, 90, (int(k),), generator=g).tolist() for k in torch.randint(2, 12, (n,), generator=g)]
    responses = [torch.randint(4, 90, (int(k),), generator=g).tolist() for k in torch.randint(1, 24, (n,), generator=g)]
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    advantages = (rewards - rewards.mean()).tolist()
    return TrainBatch.from_sequences(prompts, responses, advantages=advantages, group_ids=[i // 4 for i in range(n)])


def configs(strategy: str, *, tp_size: int = 1, activation_checkpointing: str = "none", lora_rank: int = 0):
    from rlvr.recipe.schema import AlgorithmConfig, LoraConfig, TrainerConfig

    # the one-process reference takes the full logits; the 2-rank runs 5-token chunks (FSDP2 gathers the
    # head inside the forward the chunks run in; under tensor parallel the head stays whole)
    trainer = TrainerConfig(
        strategy=strategy, lr=1e-3, packing=True, max_tokens_per_micro_batch=40, lr_schedule="cosine", warmup_steps=1,
        tp_size=tp_size, activation_checkpointing=activation_checkpointing,  # pyright: ignore[reportArgumentType]
        lora=LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank or 16.0),
        logits_chunk_tokens=0 if strategy == "none" else 5,
    )  # fmt: skip
    algorithm = AlgorithmConfig(preset="grpo", mini_batches=2, kl_coef=0.01)
    return trainer, algorithm


def run(
    model_dir: str, *, strategy: str, out: Path, save_dir: str | None = None, resume: bool = False,
    export_dir: str | None = None, impl: str = "hf", tp_size: int = 1, steps: int = STEPS,
    activation_checkpointing: str = "none", lora_rank: int = 0,
) -> None:  # fmt: skip
    """Train STEPS steps (or resume at SAVE_AT and finish); write losses and final weights to `out`."""
    from rlvr.recipe.schema import ModelConfig
    from rlvr.rundir import latest_checkpoint
    from rlvr.trainer import dist as d
    from rlvr.trainer.actor import Actor
    from rlvr.trainer.checkpoint import export_hf, load_checkpoint, save_checkpoint
    from rlvr.trainer.forward import UNCHUNKED_MARK
    from rlvr.trainer.weights import iter_full_weights

    trainer, algorithm = configs(
        strategy, tp_size=tp_size, activation_checkpointing=activation_checkpointing, lora_rank=lora_rank
    )
    device = d.init_distributed(force=strategy == "fsdp2").device
    model = ModelConfig(path=model_dir, impl=impl)  # pyright: ignore[reportArgumentType]
    actor = Actor.build(model, trainer, algorithm, total_steps=STEPS * 2, device=device, max_response_len=32)
    batch = synthetic_batch()
    start, losses = 0, []
    if resume:
        assert save_dir is not None
        latest = latest_checkpoint(save_dir)
        assert latest is not None
        extra = load_checkpoint(latest, {"actor": actor})
        start, losses = extra["step"], extra["losses"]
        torch.set_rng_state(extra["torch_rng"])
    for step in range(start, steps):
        metrics = update_policy(actor, batch)
        losses.append(actor.trainer.last_update_losses + [metrics["grad_norm"], metrics["lr"]])
        if save_dir is not None and not resume and step + 1 == SAVE_AT:
            extra = {"step": step + 1, "losses": list(losses), "torch_rng": torch.get_rng_state()}
            save_checkpoint(save_dir, step + 1, {"actor": actor}, extra=extra, keep_last=2)
    assert not getattr(actor.model, UNCHUNKED_MARK, False)  # the chunked head's output came back as the logits
    weights = {name: t.clone() for name, t in iter_full_weights(actor.model)}
    if export_dir is not None:
        export_hf(actor.model, None, export_dir)
    if d.rank() == 0:
        torch.save({"losses": losses, "weights": weights, "world": d.world_size()}, out)


def _torchrun(tmp_path: Path, model_dir: Path, out: Path, *extra: str) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        __file__, "--worker", "--model-dir", str(model_dir), "--out", str(out), *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Path, Path]:
    """One 2-rank FSDP2 run of STEPS steps that saves a checkpoint at SAVE_AT."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    out, ckpt = tmp / "full.pt", tmp / "ckpt"
    _torchrun(tmp, tiny_model_dir, out, "--save-dir", str(ckpt))
    return out, ckpt


def test_two_rank_fsdp2_matches_one_process(tmp_path: Path, tiny_model_dir: Path, two_rank_run) -> None:
    single = tmp_path / "single.pt"
    run(str(tiny_model_dir), strategy="none", out=single)
    one, two = (torch.load(p, weights_only=False) for p in (single, two_rank_run[0]))
    assert two["world"] == 2
    # 2 ranks x FSDP2 x packing == one plain process, to float32 summation-order tolerance. The losses and grad
    # norms catch a wrong scale; Adam hides a scale but turns summation noise on a near-zero gradient into up to
    # ~1e-6 of weight, so weights are held to 1% of one lr=1e-3 step
    assert torch.allclose(torch.tensor(two["losses"]), torch.tensor(one["losses"]), rtol=1e-5, atol=1e-6)
    for name, value in one["weights"].items():
        assert torch.allclose(two["weights"][name], value, rtol=1e-4, atol=1e-5), name


def test_two_rank_resume_continues_bit_identically(tmp_path: Path, tiny_model_dir: Path, two_rank_run) -> None:
    full, ckpt = two_rank_run
    resumed = tmp_path / "resumed.pt"
    hf = tmp_path / "hf"
    _torchrun(tmp_path, tiny_model_dir, resumed, "--save-dir", str(ckpt), "--resume", "--export-dir", str(hf))
    two, again = (torch.load(p, weights_only=False) for p in (full, resumed))
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", f"step_{SAVE_AT}"]
    assert again["losses"] == two["losses"]
    for name, value in two["weights"].items():
        assert torch.equal(again["weights"][name], value), name
    # the HF export gathered from the 2 FSDP2 shards is exactly those weights
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(hf).state_dict()
    for name, value in again["weights"].items():
        assert torch.equal(exported[name], value), name


def test_two_rank_lora_matches_one_process_and_resumes_bit_identically(tmp_path: Path, tiny_model_dir: Path) -> None:
    """LoRA under FSDP2 (frozen base and adapters sharded together; KL reference = adapters off):
    the same training as one process, merged weights gathered from the shards, an exact resume from a
    checkpoint of adapters only, and a merged export equal to those weights."""
    from transformers import AutoModelForCausalLM

    single, full, resumed, ckpt, hf = (tmp_path / n for n in ("single.pt", "full.pt", "resumed.pt", "ckpt", "hf"))
    run(str(tiny_model_dir), strategy="none", out=single, lora_rank=4)
    _torchrun(tmp_path, tiny_model_dir, full, "--save-dir", str(ckpt), "--lora-rank", "4")
    _torchrun(tmp_path, tiny_model_dir, resumed, "--save-dir", str(ckpt), "--resume", "--export-dir", str(hf),
              "--lora-rank", "4")  # fmt: skip
    one, two, again = (torch.load(p, weights_only=False) for p in (single, full, resumed))
    assert two["world"] == 2 and not any("lora" in n for n in two["weights"])  # merged, HF names
    assert torch.allclose(torch.tensor(two["losses"]), torch.tensor(one["losses"]), rtol=1e-5, atol=1e-6)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    moved = [n for n, v in one["weights"].items() if not torch.equal(v, base[n])]
    assert moved and all(n.endswith("proj.weight") for n in moved)  # only adapted layers changed
    for name, value in one["weights"].items():
        assert torch.allclose(two["weights"][name], value, rtol=1e-4, atol=1e-6), name
    assert again["losses"] == two["losses"]
    for name, value in two["weights"].items():
        assert torch.equal(again["weights"][name], value), name
    exported = AutoModelForCausalLM.from_pretrained(hf).state_dict()
    for name, value in again["weights"].items():
        assert torch.equal(exported[name], value), name


# -- model.impl = "torchtitan": FSDP2 and tensor parallel against the transformers model --------------------------
@pytest.fixture(scope="module")
def hf_one_process(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict:
    out = tmp_path_factory.mktemp("hf1") / "single.pt"
    run(str(tiny_model_dir), strategy="none", out=out)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def titan_tp_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Path, Path]:
    """torchtitan, tp_size = 2 on 2 ranks (one replica), STEPS steps, a checkpoint at SAVE_AT."""
    tmp = tmp_path_factory.mktemp("titan_tp")
    out, ckpt = tmp / "full.pt", tmp / "ckpt"
    _torchrun(tmp, tiny_model_dir, out, "--save-dir", str(ckpt), "--impl", "torchtitan", "--tp-size", "2")
    return out, ckpt


def _assert_same_training(got: dict, expected: dict, *, steps: int) -> None:
    assert torch.allclose(torch.tensor(got["losses"]), torch.tensor(expected["losses"][:steps]), rtol=1e-5, atol=1e-6)
    assert got["weights"].keys() == expected["weights"].keys()  # HF names from either implementation
    for name, value in expected["weights"].items():
        assert torch.allclose(got["weights"][name], value, atol=1e-5), name


@pytest.mark.torchtitan
def test_torchtitan_tensor_parallel_trains_like_transformers(hf_one_process: dict, titan_tp_run) -> None:
    tp = torch.load(titan_tp_run[0], weights_only=False)
    assert tp["world"] == 2
    _assert_same_training(tp, hf_one_process, steps=STEPS)


@pytest.mark.torchtitan
def test_torchtitan_fsdp2_trains_like_transformers(tmp_path: Path, tiny_model_dir: Path) -> None:
    """One step (two mini-batch updates) on 2 FSDP2 ranks against one transformers process."""
    hf, fsdp = tmp_path / "hf.pt", tmp_path / "fsdp.pt"
    run(str(tiny_model_dir), strategy="none", out=hf, steps=1)
    _torchrun(tmp_path, tiny_model_dir, fsdp, "--impl", "torchtitan", "--steps", "1")
    _assert_same_training(torch.load(fsdp, weights_only=False), torch.load(hf, weights_only=False), steps=1)


@pytest.mark.torchtitan
def test_torchtitan_tensor_parallel_resumes_bit_identically_and_exports(
    tmp_path: Path, tiny_model_dir: Path, titan_tp_run
) -> None:
    from transformers import AutoModelForCausalLM

    full, ckpt = titan_tp_run
    resumed, hf = tmp_path / "resumed.pt", tmp_path / "hf"
    _torchrun(tmp_path, tiny_model_dir, resumed, "--save-dir", str(ckpt), "--resume", "--export-dir", str(hf),
              "--impl", "torchtitan", "--tp-size", "2")  # fmt: skip
    two, again = (torch.load(p, weights_only=False) for p in (full, resumed))
    assert again["losses"] == two["losses"]
    for name, value in two["weights"].items():
        assert torch.equal(again["weights"][name], value), name
    exported = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)  # gathered from the TP shards
    for name, value in exported.state_dict().items():
        if name != "lm_head.weight":  # tied to the embeddings
            assert torch.equal(again["weights"][name], value), name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--export-dir")
    parser.add_argument("--impl", default="hf")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--activation-checkpointing", default="none")
    parser.add_argument("--lora-rank", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    run(
        args.model_dir, strategy="fsdp2", out=Path(args.out), save_dir=args.save_dir, resume=args.resume,
        export_dir=args.export_dir, impl=args.impl, tp_size=args.tp_size, steps=args.steps,
        activation_checkpointing=args.activation_checkpointing, lora_rank=args.lora_rank,
    )  # fmt: skip
    torch.distributed.barrier()  # a rank that tears gloo down while its peer still talks aborts the peer
    torch.distributed.destroy_process_group()
    exit_process(0)  # as rlvr/worker.py does


if __name__ == "__main__":
    main()
