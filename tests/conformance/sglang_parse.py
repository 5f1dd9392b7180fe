"""Parse request bodies and a launch command with SGLang 0.5.23's own code (runs under sglang_boot.py).

stdin: {"bodies": [[path, body], ...], "argv": [...]}; stdout: one JSON report.

Bodies go through what the HTTP server applies (`sglang/srt/entrypoints/http_server.py`):
/generate: FastAPI's parse of the `GenerateReqInput` dataclass, the `generate_contract_error`
schema gate (400 on unknown sampling_params keys) and `normalize_batch_and_arguments`; the
other routes: pydantic over their `io_struct` request types (which ignore unknown keys, so
the report also lists keys a type does not have: fields SGLang would silently drop).
The argv goes through `ServerArgs.add_cli_args` + argparse, as `prepare_server_args` does
before it builds a `ServerArgs` (whose `__post_init__` probes the GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import msgspec
import pydantic
from sglang.srt.entrypoints.api_contract import generate_contract_error
from sglang.srt.managers import io_struct as io
from sglang.srt.server_args import ServerArgs

TYPES = {
    "/pause_generation": io.PauseGenerationReqInput,
    "/continue_generation": io.ContinueGenerationReqInput,
    "/init_weights_update_group": io.InitWeightsUpdateGroupReqInput,
    "/update_weights_from_distributed": io.UpdateWeightsFromDistributedReqInput,
    "/update_weights_from_disk": io.UpdateWeightFromDiskReqInput,
    "/destroy_weights_update_group": io.DestroyWeightsUpdateGroupReqInput,
    "/begin_weight_update": io.BeginWeightUpdateReqInput,
    "/end_weight_update": io.EndWeightUpdateReqInput,
}


def fields_of(cls) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return {f.name for f in msgspec.structs.fields(cls)}


def check(path: str, body) -> dict:
    if path == "/generate":
        contract = generate_contract_error(body)
        obj = pydantic.TypeAdapter(io.GenerateReqInput).validate_json(json.dumps(body))
        obj.normalize_batch_and_arguments()
        params = obj.sampling_params if isinstance(obj.sampling_params, list) else [obj.sampling_params]
        return {
            "contract_error": contract,
            "unknown": sorted(set(body) - fields_of(io.GenerateReqInput)),
            "is_single": obj.is_single,
            "batch_size": obj.batch_size,
            "parallel_sample_num": obj.parallel_sample_num,
            "seeds": [p.get("sampling_seed") for p in params],
            "rid": obj.rid,
        }
    cls = TYPES[path]
    obj = pydantic.TypeAdapter(cls).validate_json(json.dumps(body if body is not None else {}))
    parsed = {f.name: msgspec.to_builtins(getattr(obj, f.name)) for f in msgspec.structs.fields(cls)}
    return {"unknown": sorted(set(body or {}) - fields_of(cls)), "parsed": parsed}


def main() -> None:
    request = json.load(sys.stdin)
    report: dict = {"bodies": []}
    for path, body in request["bodies"]:
        try:
            report["bodies"].append([path, check(path, body)])
        except Exception as exc:  # noqa: BLE001 - reported to the test
            report["bodies"].append([path, {"error": f"{type(exc).__name__}: {exc}"}])
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    try:
        args = parser.parse_args(request["argv"])
        report["args"] = {k: v for k, v in vars(args).items() if isinstance(v, str | int | float | bool | type(None))}
    except SystemExit as exc:
        report["args_error"] = f"argparse exit {exc.code}"
    print(json.dumps(report))


if __name__ == "__main__":
    main()
