"""The RL loop on 2 gloo trainer ranks (torchrun): rank 0's rollout batch reaches rank 1 intact,
and a stop raised on one rank stops both at the same step with a checkpoint.

This file is also the torchrun worker (`python -m torch.distributed.run ... <this file> --worker`).
It builds the parts `rlvr.worker` builds (FSDP2 actor on both ranks; engine, rollout manager and
recorder on rank 0; in-process weight sync), asynchronous with k = 1, and raises the stop flag on
rank 1 only, after step 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from rlvr.trainer.dist import exit_process


def worker(model_dir: str, out: Path) -> None:
    import rlvr.loop
    from rlvr.loop import PREEMPTED_EXIT
    from rlvr.trainer import dist as d
    from tests.unit.loop.test_loop import make_loop, run

    d.init_distributed(force=True)
    seen: list[str] = []
    train_on = rlvr.loop.train_on

    def recording(rollout, **kw):  # what each rank trains on, after the broadcast
        seen.append(
            hashlib.sha256(json.dumps([rollout.prompts, rollout.responses, rollout.rewards]).encode()).hexdigest()
        )
        return train_on(rollout, **kw)

    rlvr.loop.train_on = recording
    loop = make_loop(out / "run", Path(model_dir), steps=5, k=1, strategy="fsdp2")
    loop.recipe.experiment.save_steps = 0
    if d.rank() == 1:
        log = loop.log

        def log_then_stop(metrics):
            log(metrics)
            if loop.step == 2:
                loop.stop.raised = True  # as a SIGTERM on this rank alone would

        loop.log = log_then_stop  # type: ignore[method-assign]
    run(loop, expect=PREEMPTED_EXIT)
    weights = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in loop.actor.model.state_dict().items()}
    digest = hashlib.sha256(b"".join(w.detach().contiguous().numpy().tobytes() for w in weights.values())).hexdigest()
    (out / f"rank{d.rank()}.json").write_text(json.dumps({"step": loop.step, "seen": seen, "weights": digest}))


def test_two_ranks_share_the_batch_and_stop_together(tmp_path: Path) -> None:
    from rlvr.tiny import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path / "tiny")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}",
           __file__, "--worker", "--model-dir", str(model_dir), "--out", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 2  # rank 1's stop stopped rank 0 too, after step 2
    assert ranks[0]["seen"] == ranks[1]["seen"] and len(ranks[0]["seen"]) == 2
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert (tmp_path / "run" / "checkpoints" / "step_2").is_dir()  # the stop saved before exiting


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    worker(args.model_dir, Path(args.out))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    exit_process(0)


if __name__ == "__main__":
    main()
