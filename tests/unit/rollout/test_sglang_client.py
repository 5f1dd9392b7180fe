"""SGLang command lines and response conversion (no server needed)."""

from __future__ import annotations

import pytest

from rlvr.recipe.schema import RolloutConfig, SGLangConfig
from rlvr.rollout.sglang import SGLangClient, build_sglang_command, completions_from_sglang


def test_sglang_command_from_recipe():
    cfg = RolloutConfig(
        engine="sglang",
        sglang=SGLangConfig(
            python="/envs/sglang/bin/python",
            tp_size=2,
            dp_size=1,
            mem_fraction_static=0.7,
            api_key="k",
            extra_args=["--enable-memory-saver"],
        ),
    )
    argv = build_sglang_command(
        cfg, model_path="/models/qwen", port=30001, gpu_ids=[2, 3], dtype="bfloat16", weight_version="0", seed=1
    )
    assert argv == [
        "env",
        "CUDA_VISIBLE_DEVICES=2,3",
        "/envs/sglang/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/qwen",
        "--host",
        "0.0.0.0",
        "--port",
        "30001",
        "--tp-size",
        "2",
        "--dp-size",
        "1",
        "--mem-fraction-static",
        "0.7",
        "--dtype",
        "bfloat16",
        "--api-key",
        "k",
        "--weight-version",
        "0",
        "--random-seed",
        "1",
        "--enable-memory-saver",
    ]
    assert "--skip-tokenizer-init" not in argv  # stop strings and text need the detokenizer


def test_completions_from_sglang_output():
    output = [
        {
            "text": "ab",
            "output_ids": [10, 11],
            "meta_info": {
                "finish_reason": {"type": "stop", "matched": 1},
                "weight_version": "4",
                "output_token_logprobs": [[-0.5, 10, None], [-1.5, 11, None]],
            },
        },
        {"text": "c", "output_ids": [12], "meta_info": {"finish_reason": {"type": "length", "length": 1}}},
    ]
    first, second = completions_from_sglang(output, [1, 2])
    assert first.token_ids == [10, 11] and first.logprobs == [-0.5, -1.5] and first.finish_reason == "stop"
    assert first.policy_version == 4 and first.prompt_token_ids == [1, 2]
    assert second.finish_reason == "length" and second.logprobs == [] and second.policy_version == 0
    with pytest.raises(ValueError):
        completions_from_sglang({"output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[0.0, 1, None]]}}, [])


def test_least_outstanding_pick():
    client = SGLangClient(["http://a", "http://b", "http://c"])
    client.servers[0].outstanding = 2
    client.servers[1].outstanding = 1
    client.servers[2].outstanding = 1
    client.servers[2].alive = False
    import time

    client.servers[2].dead_since = time.monotonic()
    assert client.pick(set()).url == "http://b"  # type: ignore[union-attr]
    assert client.pick({"http://b"}).url == "http://a"  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        SGLangClient([])


def test_a_held_server_stays_out_of_rotation_past_the_revive_time(monkeypatch) -> None:
    """The weight sync holds a dropped engine (stale weights): the real client must not revive
    it after `revive_after_s` like a crashed one, even when /health answers; `admit` does."""
    import rlvr.rollout.pool as sg

    client = SGLangClient(["http://a:1", "http://b:1"], revive_after_s=30)
    client.hold("http://b:1")
    now = [1000.0]
    monkeypatch.setattr(sg.time, "monotonic", lambda: now[0])
    client.servers[1].dead_since = now[0]
    now[0] += 3600  # long past the revive time
    assert {client.pick(set()).url for _ in range(50)} == {"http://a:1"}  # type: ignore[union-attr]
    assert client.pick({"http://a:1"}) is None
    assert client.live_servers == ["http://a:1"] and client.held_servers == ["http://b:1"]
    client.admit("http://b:1")
    assert client.live_servers == ["http://a:1", "http://b:1"] and client.held_servers == []
    assert client.pick({"http://a:1"}).url == "http://b:1"  # type: ignore[union-attr]
