"""Weight sync from a tensor-parallel torchtitan trainer (tp = 2 on 2 gloo ranks) to `rlvr serve`.

This file is also the torchrun worker. The worker builds the tiny Qwen3 with
model.impl = "torchtitan" split over 2 TP ranks, perturbs it, pushes it by broadcast, and asks
the server for greedy completions with logprobs; the test checks that they are what a
transformers forward on the trainer's gathered weights gives (HF names and layouts on the wire).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integration.test_sync import (  # noqa: F401
    PROMPTS,
    _ask,
    _local_answers,
    run_two_rank_worker,
    server,
    worker_main,
)

pytestmark = pytest.mark.torchtitan
VERSION = 3


def worker(model_dir: str, url: str, out: Path, run_dir: Path) -> None:
    from transformers import AutoTokenizer

    from rlvr.recipe.schema import ModelConfig, SyncConfig, TrainerConfig
    from rlvr.rollout.sglang import SGLangClient
    from rlvr.sync import make_weight_sync
    from rlvr.trainer import dist as d
    from rlvr.trainer.model import build_model
    from rlvr.trainer.weights import iter_full_weights

    device = d.init_distributed(force=True).device
    cfg = ModelConfig(path=model_dir, dtype="float32", impl="torchtitan")
    model = build_model(cfg, TrainerConfig(strategy="fsdp2", tp_size=2), device=device, trainable=False)
    g = torch.Generator().manual_seed(VERSION)  # the same noise on both ranks: replicated weights stay equal
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p  # pyright: ignore[reportAttributeAccessIssue]
            local.add_(torch.randn(local.shape, generator=g) * 0.5)
    client = SGLangClient([url], timeout_s=60) if d.rank() == 0 else None
    sync = make_weight_sync(
        SyncConfig(method="broadcast", bucket_mb=1, timeout_s=30), model=model, client=client, run_dir=run_dir
    )
    sync.push(version=VERSION)
    sync.close()
    weights = {name: t.clone() for name, t in iter_full_weights(model)}
    if d.rank() == 0:
        torch.save({"weights": weights, "answers": _ask(url, AutoTokenizer.from_pretrained(model_dir))}, out)
    d.barrier()


def test_broadcast_from_tensor_parallel_torchtitan(tmp_path: Path, tiny_model_dir: Path, server: str) -> None:  # noqa: F811
    result = run_two_rank_worker(__file__, tmp_path, tiny_model_dir, server)
    assert [a["v"] for a in result["answers"]] == [VERSION] * len(PROMPTS)
    _local_answers(tiny_model_dir, result["weights"], result["answers"])


def main() -> None:
    worker_main(worker)


if __name__ == "__main__":
    main()
