"""One SGLang tensor-parallel worker's weight-update half, driven over stdin/stdout (JSON lines).

Runs under sglang_boot.py. Uses SGLang's own code end to end: request bodies are parsed by
its request types as FastAPI does (`pydantic.TypeAdapter(...).validate_json`), the group is
joined by its `WeightUpdater.init_weights_update_group` (rank = rank_offset + tp_rank, via
`init_custom_process_group`), and buckets are received by its
`receive_weights_from_distributed` (`FlattenedTensorBucket` for flattened buckets).

argv: tp_rank tp_size tp_port (the workers' own default group, which SGLang asserts exists).
Commands: {"op": "init"|"update"|"destroy", "body": {...}}, {"op": "dump", "path": ...}, {"op": "exit"}.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import pydantic
import torch
import torch.distributed as dist
from sglang.srt.managers.io_struct import (
    DestroyWeightsUpdateGroupReqInput,
    InitWeightsUpdateGroupReqInput,
    UpdateWeightsFromDistributedReqInput,
)
from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater


def parse(cls, body):
    return pydantic.TypeAdapter(cls).validate_json(json.dumps(body))


def main() -> None:
    tp_rank, tp_size, tp_port = (int(a) for a in sys.argv[1:4])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{tp_port}",
        rank=tp_rank,
        world_size=tp_size,
        timeout=timedelta(seconds=120),
    )
    updater = WeightUpdater(
        tp_rank=tp_rank,
        device="cpu",
        gpu_id=0,
        model_config=None,
        custom_weight_loaders={},
        get_model=lambda: None,
        update_model_fields=lambda **kw: None,
        recapture_cuda_graph=lambda: None,
        get_model_runner=lambda: None,
    )
    received: dict[str, torch.Tensor] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        reply: dict = {"ok": True}
        try:
            if op == "init":
                req = parse(InitWeightsUpdateGroupReqInput, command["body"])
                ok, message = updater.init_weights_update_group(
                    req.master_address, req.master_port, req.rank_offset, req.world_size, req.group_name, req.backend
                )
                group = updater._model_update_group.get(req.group_name)
                reply = {"success": ok, "message": message, "rank": req.rank_offset + tp_rank}
                if group is not None:
                    reply.update(group_rank=group.rank(), group_size=group.size())
            elif op == "update":
                req = parse(UpdateWeightsFromDistributedReqInput, command["body"])
                weights = updater.receive_weights_from_distributed(
                    names=req.names,
                    dtypes=req.dtypes,
                    shapes=req.shapes,
                    group_name=req.group_name,
                    load_format=req.load_format,
                )
                for name, tensor in weights:
                    received[name] = tensor.clone()
                reply = {"success": True, "message": "ok", "weight_version": req.weight_version}
            elif op == "destroy":
                req = parse(DestroyWeightsUpdateGroupReqInput, command["body"])
                ok, message = updater.destroy_weights_update_group(req.group_name)
                reply = {"success": ok, "message": message}
            elif op == "dump":
                torch.save(received, command["path"])
            elif op == "exit":
                print(json.dumps(reply), flush=True)
                break
        except Exception as exc:  # noqa: BLE001 - reported to the test
            reply = {"success": False, "message": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
