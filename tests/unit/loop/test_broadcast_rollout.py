"""The loop's batch broadcast between two gloo ranks: every rank gets the same batch as flat arrays
in one buffer, beside a header that holds no per-token data (never a pickle of rows of numbers)."""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path


def rank_main(rank: int, store: str, out: str) -> None:
    import numpy as np
    import torch.distributed as dist

    from rlvr.trainer import dist as d
    from rlvr.types import RolloutBatch

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    headers: list[int] = []
    real = dist.broadcast_object_list

    def measured(objects, src=0, **kw):  # how many bytes travel pickled
        headers.append(len(pickle.dumps(objects)))
        return real(objects, src=src, **kw)

    dist.broadcast_object_list = measured  # type: ignore[assignment]
    rng = np.random.default_rng(0)
    sent = None
    if rank == 0:
        sent = RolloutBatch()
        for i in range(64):
            length = int(rng.integers(0, 300))
            sent.prompts.append(rng.integers(0, 150_000, 20).tolist())
            sent.responses.append(rng.integers(0, 150_000, length).tolist())
            sent.rollout_logprobs.append((-rng.random(length)).tolist())
            sent.loss_masks.append(1.0 if i % 3 else rng.integers(0, 2, length).astype(float).tolist())
            sent.rewards.append(float(i % 2))
            sent.group_ids.append(i // 8)
            sent.domains.append("math" if i % 2 else "code")
            sent.versions.append(i % 3)
    got, failure = d.broadcast_rollout(sent, "why" if rank == 0 else None)
    nothing, second = d.broadcast_rollout(None, "rollout failed" if rank == 0 else None)
    assert got is not None
    result = {
        "rows": [got.prompts, got.responses, got.rollout_logprobs, got.loss_masks],
        "seq": [got.rewards, got.group_ids, got.domains, got.versions],
        "failure": failure,
        "second": (nothing, second),
        "header_bytes": max(headers),
        "tokens": got.num_tokens,
    }
    Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(result))
    dist.destroy_process_group()


def test_every_rank_gets_the_same_batch_in_one_buffer(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, str(tmp_path / "store"), str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    sent, got = (pickle.loads((tmp_path / f"{r}.pkl").read_bytes()) for r in range(2))
    assert got["rows"][:2] == sent["rows"][:2] and got["rows"][3] == sent["rows"][3]
    assert got["rows"][2] == sent["rows"][2]  # float32 both sides: rank 0 packed before sending
    assert got["seq"] == sent["seq"] and got["tokens"] == sent["tokens"] > 5_000
    assert got["failure"] == "why" and got["second"] == (None, "rollout failed")
    # ~10k tokens went over, but what travels pickled is the header alone (names, dtypes, domains)
    assert got["header_bytes"] < 4_000, got["header_bytes"]
