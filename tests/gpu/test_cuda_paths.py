"""The CUDA code paths CI cannot reach: the embedded engine in bf16, FSDP2 mixed precision on
NCCL, and the NCCL weight-update group. Run on a GPU machine: `pytest -m gpu tests/gpu`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_embedded_engine_bf16_logprobs_match_forward(tiny_model_dir: Path) -> None:
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.rollout.base import GenerateRequest, SamplingParams
    from rlvr.server.embedded import EmbeddedEngine

    engine = EmbeddedEngine(tiny_model_dir, dtype="bfloat16", device="cuda", max_batch=8)
    try:
        prompt = [5, 17, 40, 33, 21]
        [completion] = asyncio.run(
            engine.generate(
                [GenerateRequest(prompt, SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True))]
            )
        )
    finally:
        engine.close()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).cuda().eval()
    ids = torch.tensor([prompt + completion.token_ids], device="cuda")
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), -1)[0, len(prompt) - 1 : -1]
    expected = logp.gather(-1, ids[0, len(prompt) :, None]).squeeze(-1).cpu()
    torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=0.05, rtol=0)


def test_fsdp2_bf16_step_on_nccl(tiny_model_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "step.py"
    script.write_text(
        textwrap.dedent(f"""
        import torch
        from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
        from rlvr.trainer.actor import Actor
        from rlvr.trainer.batch import TrainBatch
        actor = Actor.build(ModelConfig(path={str(tiny_model_dir)!r}), TrainerConfig(param_dtype="bfloat16"),
                            AlgorithmConfig(preset="grpo"), total_steps=2)
        batch = TrainBatch.from_sequences([[5, 6, 7]] * 4, [[8, 9], [10], [11, 12, 13], [14]],
                                          advantages=[1.0, -1.0, 0.5, -0.5], group_ids=[0, 0, 1, 1])
        metrics = update_policy(actor, batch)
        assert torch.isfinite(torch.tensor(metrics["loss"])), metrics
        print("ok", metrics["loss"])
    """)
    )
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


WEIGHT_RECEIVER = """
import sys, torch
from rlvr.sync.group import join_group_like_sglang, receive_broadcast
from rlvr.trainer.step import update_policy
port, name = int(sys.argv[1]), sys.argv[2]
torch.cuda.set_device(1)
group = join_group_like_sglang(master_address="127.0.0.1", master_port=port, rank=1, world_size=2,
                               group_name=name, backend="nccl", timeout_s=120)
[(_, flat)] = receive_broadcast(group, ["flat"], ["uint8"], [[int(sys.argv[3])]], device="cuda")
torch.cuda.synchronize()
print("sum", int(flat.to(torch.int64).sum()))
"""


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available() or __import__("torch").cuda.device_count() < 2,
    reason="NCCL needs one GPU per rank (two processes on one GPU: 'Duplicate GPU detected')",
)
def test_nccl_weight_group_between_two_processes(tmp_path: Path) -> None:
    """Trainer rank 0 (this process, cuda:0) and an engine member built the way SGLang builds
    it (another process, cuda:1) meet over NCCL and move a 256 MB bf16 bucket; prints GB/s."""
    import socket
    import time

    import torch

    from rlvr.sync.group import join_group, send_broadcast

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    flat = torch.randint(0, 255, (256 * 2**20,), dtype=torch.uint8, device="cuda:0")
    script = tmp_path / "receiver.py"
    script.write_text(WEIGHT_RECEIVER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), "g", str(flat.numel())], stdout=subprocess.PIPE, text=True
    )
    torch.cuda.set_device(0)
    group = join_group(
        master_address="127.0.0.1", master_port=port, rank=0, world_size=2, group_name="g", backend="nccl"
    )
    start = time.monotonic()
    send_broadcast(group, [flat])
    torch.cuda.synchronize()
    seconds = time.monotonic() - start
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and f"sum {int(flat.to(torch.int64).sum())}" in out, out
    print(f"nccl weight group: 256 MB in {seconds:.3f}s ({0.268 / seconds:.1f} GB/s, first broadcast incl. setup)")
    group.shutdown()


def test_verify_fingerprint_on_cuda_is_exact_and_its_cost_printed() -> None:
    """`sync.verify`'s checksum on CUDA equals the CPU's for the same bytes (bf16 and fp32, a
    tensor at an odd offset), and its time for 1.4 GB is printed: the verify cost on a GPU is
    this per side, against a push over NCCL (on the 2-core CPU it is ~57 ms per side, 22-28%
    of the push: docs/weight-sync.md)."""
    import time

    import torch

    from rlvr.sync.fingerprint import fingerprint

    torch.manual_seed(0)
    small = [("w", torch.randn(1001, 17)), ("h", torch.randn(33, dtype=torch.bfloat16))]
    packed = torch.empty(1 + 1001 * 17, dtype=torch.float32)
    packed[1:] = small[0][1].reshape(-1)
    on_cpu = fingerprint(small + [("odd", packed[1:])])
    on_gpu = fingerprint([(n, t.cuda()) for n, t in small] + [("odd", packed.cuda()[1:])])
    assert on_gpu == on_cpu and on_gpu["odd"] == on_gpu["w"]
    weights = [(f"layer{i}", torch.randn(4096, 4096, device="cuda")) for i in range(21)]  # 21 x 64 MB = 1.4 GB
    fingerprint(weights)  # warm-up
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fingerprint(weights)  # one host sync, at the end
        times.append(time.perf_counter() - start)
    best = min(times)
    print(f"verify fingerprint on CUDA: 1.41 GB in {best * 1e3:.2f} ms best of 5 ({1.41 / best:.0f} GB/s)")
