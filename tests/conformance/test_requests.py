"""Every request body SGLangClient sends, and the launch command the recipe builds, parsed by
SGLang 0.5.23's own request types and server-argument parser (see sglang_parse.py)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from aiohttp import web

from rlvr.recipe.schema import RolloutConfig
from rlvr.rollout.base import GenerateRequest, SamplingParams
from rlvr.rollout.sglang import SGLangClient, build_sglang_command

from .sglang_env import run_with_sglang

pytestmark = pytest.mark.sglang


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fake_generate(body: dict[str, Any]) -> Any:
    """Just enough of SGLang's /generate answer for the client to accept it."""
    batched = isinstance(body["input_ids"][0], list)
    items = body["sampling_params"] if batched else [body["sampling_params"]]
    out = [
        {
            "text": "x",
            "output_ids": [5],
            "meta_info": {
                "finish_reason": {"type": "length"},
                "weight_version": "0",
                "output_token_logprobs": [[-0.5, 5, None]],
            },
        }  # fmt: skip
        for item in items
        for _ in range(item.get("n", 1))
    ]
    return out if batched or len(out) > 1 else out[0]


async def _record_client_bodies() -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        seen.append((request.path, body))
        if request.path == "/generate":
            return web.json_response(_fake_generate(body))
        return web.json_response({"success": True, "message": "ok"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    client = SGLangClient([f"http://127.0.0.1:{port}"], timeout_s=30)
    try:
        params = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, max_new_tokens=16)
        await client.generate([GenerateRequest([1, 2, 3], params, n=4)])
        seeded = SamplingParams(max_new_tokens=8, seed=11, stop=["\n\n"], stop_token_ids=[2], ignore_eos=True)
        await client.generate([GenerateRequest([1, 2], seeded, n=3, rid="q7")])
        await client.generate([GenerateRequest([4], SamplingParams(temperature=0.0), n=1, rid="one")])
        for mode in ("abort", "retract", "in_place"):
            await client.pause(mode)  # type: ignore[arg-type]
        await client.flush_cache()
        await client.begin_weight_update()
        await client.init_weights_update_group(
            master_address="10.0.0.1", master_port=29500, rank_offset=1, world_size=3, group_name="g", backend="nccl"
        )
        await client.update_weights_from_distributed(
            ["a", "b"], ["bfloat16", "bfloat16"], [[2, 3], [4]], group_name="g", version=None, flush_cache=False
        )
        await client.update_weights_from_distributed(
            ["c"], ["bfloat16"], [[8]], group_name="g", version=7, flush_cache=True, load_format="flattened_bucket"
        )
        await client.end_weight_update()
        await client.destroy_weights_update_group("g")
        await client.update_weights_from_disk("/ckpt/v7", version=7)
        await client.resume()
    finally:
        await client.close()
        await runner.cleanup()
    return seen


def test_every_client_body_parses_as_sglang_parses_it(sglang_site) -> None:
    bodies = asyncio.run(_record_client_bodies())
    rollout = RolloutConfig.model_validate(
        {
            "engine": "sglang",
            "sglang": {"tp_size": 2, "api_key": "k", "extra_args": ["--enable-deterministic-inference"]},
        }
    )
    argv = build_sglang_command(
        rollout, model_path="/models/qwen", port=30001, dtype="bfloat16", weight_version="0", seed=3
    )
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    request = {"bodies": [[p, b] for p, b in bodies if p != "/flush_cache"], "argv": argv[3:]}
    report = json.loads(run_with_sglang(sglang_site, "sglang_parse.py", stdin=json.dumps(request)).splitlines()[-1])
    results = report["bodies"]
    assert [p for p, _ in results] == [p for p, _ in request["bodies"]]
    for path, result in results:
        assert "error" not in result, (path, result)
        assert result["unknown"] == [], (path, result)  # nothing SGLang would silently drop
        if path == "/generate":
            assert result["contract_error"] is None, result
    plain, seeded, single = (r for p, r in results if p == "/generate")
    assert plain["parallel_sample_num"] == 4 and plain["seeds"] == [None] * 4
    # a seeded group: n items with their own seeds, so the samples differ under deterministic inference
    assert seeded["batch_size"] == 3 and seeded["parallel_sample_num"] == 1 and seeded["seeds"] == [11, 12, 13]
    assert seeded["rid"] == ["q7-0", "q7-1", "q7-2"]
    assert single["is_single"] and single["rid"] == "one"
    parsed = {p: r.get("parsed") for p, r in results}
    assert parsed["/update_weights_from_distributed"]["load_format"] == "flattened_bucket"
    assert parsed["/update_weights_from_distributed"]["weight_version"] == "7"
    assert parsed["/init_weights_update_group"]["rank_offset"] == 1
    assert [r["parsed"]["mode"] for p, r in results if p == "/pause_generation"] == ["abort", "retract", "in_place"]
    args = report["args"]
    assert args["model_path"] == "/models/qwen" and args["port"] == 30001 and args["tp_size"] == 2
    assert args["dp_size"] == 1 and args["dtype"] == "bfloat16" and args["weight_version"] == "0"
    assert args["random_seed"] == 3 and args["api_key"] == "k" and args["enable_deterministic_inference"] is True
