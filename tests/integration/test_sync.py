"""Weight sync end to end on CPU: 2 FSDP2 trainer ranks (torchrun, gloo) -> 1 `rlvr serve` process.

This file is also the torchrun worker (`... test_sync.py --worker`). The worker perturbs
its sharded weights, pushes them by broadcast (version 7), asks the server for greedy
completions with logprobs, perturbs again, pushes them by disk (version 8), asks again,
and saves the full weights and the server's answers at each stage. The test then checks
that the server's tokens and logprobs are those of a local HF forward on those weights.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr.process import free_port
from rlvr.trainer.dist import exit_process

PROMPTS = ["hello world", "2+2=", "abc"]
NEW_TOKENS = 8


# -- the torchrun worker ---------------------------------------------------------------------


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Add noise to every rank's local shard (each rank different), as an optimizer step would."""
    from rlvr.trainer import dist as d

    g = torch.Generator().manual_seed(seed * 100 + d.rank())
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p  # pyright: ignore[reportAttributeAccessIssue]
            local.add_(torch.randn(local.shape, generator=g) * 0.5)


def _ask(url: str, tokenizer) -> list[dict]:
    from rlvr.rollout.base import GenerateRequest, SamplingParams
    from rlvr.rollout.sglang import SGLangClient

    async def go():
        async with SGLangClient([url], timeout_s=60) as client:
            params = SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
            done = await client.generate([GenerateRequest(tokenizer.encode(p), params) for p in PROMPTS])
            return [
                {"prompt": c.prompt_token_ids, "ids": c.token_ids, "lps": c.logprobs, "v": c.policy_version}
                for c in done
            ]

    return asyncio.run(go())


def worker(model_dir: str, url: str, out: Path, run_dir: Path) -> None:
    from transformers import AutoTokenizer

    from rlvr.recipe.schema import ModelConfig, SyncConfig, TrainerConfig
    from rlvr.rollout.sglang import SGLangClient
    from rlvr.sync import make_weight_sync
    from rlvr.trainer import dist as d
    from rlvr.trainer.model import build_model
    from rlvr.trainer.weights import iter_full_weights

    device = d.init_distributed(force=True).device
    model = build_model(
        ModelConfig(path=model_dir, dtype="float32"), TrainerConfig(strategy="fsdp2"), device=device, trainable=False
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    client = SGLangClient([url], timeout_s=60) if d.rank() == 0 else None
    results = {}
    for version, method in ((7, "broadcast"), (8, "disk")):
        assert method in ("broadcast", "disk")
        _perturb(model, version)
        cfg = SyncConfig(method=method, bucket_mb=1, timeout_s=20)
        assert cfg.verify == "auto"
        sync = make_weight_sync(cfg, model=model, client=client, run_dir=run_dir)
        metrics = sync.push(version=version)
        sync.close()
        weights = {name: t.clone() for name, t in iter_full_weights(model)}
        if d.rank() == 0:
            results[method] = {"weights": weights, "answers": _ask(url, tokenizer), "metrics": metrics}
    if d.rank() == 0:
        torch.save(results, out)
    d.barrier()


# -- the test --------------------------------------------------------------------------------


@pytest.fixture
def server(tiny_model_dir: Path, tmp_path: Path):
    from tests.conftest import embedded_server

    with embedded_server(tiny_model_dir, log=tmp_path / "server.log", max_batch=4, max_seq_len=64) as url:
        yield url


def _local_answers(model_dir: Path, weights: dict[str, torch.Tensor], answers: list[dict]) -> None:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    with torch.no_grad():
        for answer in answers:
            prompt = torch.tensor([answer["prompt"]])
            greedy = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS)
            assert greedy[0, prompt.shape[1] :].tolist() == answer["ids"]
            full = torch.tensor([answer["prompt"] + answer["ids"]])
            logits = model(full).logits[0, prompt.shape[1] - 1 : -1]
            lps = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(answer["ids"])[:, None])[:, 0]
            assert torch.allclose(lps, torch.tensor(answer["lps"]), atol=1e-4), (lps, answer["lps"])


def run_two_rank_worker(script: str, tmp_path: Path, model_dir: Path, server: str) -> dict:
    """`script --worker` on 2 torchrun ranks against `server`; what it saved (test_titan_sync shares it)."""
    out = tmp_path / "out.pt"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        script, "--worker", "--model-dir", str(model_dir), "--url", server, "--out", str(out),
        "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    server_log = (tmp_path / "server.log").read_text()[-3000:]
    assert proc.returncode == 0, (
        f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\nserver:\n{server_log}"
    )
    return torch.load(out, weights_only=False)


def test_broadcast_and_disk_sync_from_two_fsdp2_ranks(tmp_path: Path, tiny_model_dir: Path, server: str) -> None:
    results = run_two_rank_worker(__file__, tmp_path, tiny_model_dir, server)
    for method, version in (("broadcast", 7), ("disk", 8)):
        result = results[method]
        assert [a["v"] for a in result["answers"]] == [version] * len(PROMPTS), method
        _local_answers(tiny_model_dir, result["weights"], result["answers"])
    assert results["broadcast"]["metrics"]["sync/engines"] == 1
    for method in ("broadcast", "disk"):  # sync.verify = "auto" (the default) asked `rlvr serve` over HTTP
        metrics = results[method]["metrics"]
        assert metrics["sync/verified_engines"] == 1 and metrics["sync/verify_s"] > 0, (method, metrics)
    assert sorted(p.name for p in (tmp_path / "run" / "weights").iterdir()) == ["v8"]
    # the second perturbation changed what the server says: the disk sync really replaced the broadcast weights
    assert results["broadcast"]["answers"] != results["disk"]["answers"]


def worker_main(run_worker) -> None:
    """The `--worker` entry `run_two_rank_worker` starts: parse, run, leave together."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    run_worker(args.model_dir, args.url, Path(args.out), Path(args.run_dir))
    torch.distributed.barrier()  # leave together (see rlvr/worker.py)
    torch.distributed.destroy_process_group()
    exit_process(0)  # as rlvr/worker.py does


def main() -> None:
    worker_main(worker)


if __name__ == "__main__":
    main()
