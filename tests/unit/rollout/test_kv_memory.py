"""What the embedded engine holds: a KV cache sized from the recipe, one copy of the weights
read from the files, a start-up line that says so, and a KV cache that can be freed."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from rlvr.bridge import run_blocking
from rlvr.rollout.base import GenerateRequest, SamplingParams
from rlvr.server.embedded import EmbeddedEngine
from rlvr.server.kv_cache import KVBudgetError, kv_bytes_per_token

ROOT = Path(__file__).resolve().parents[3]


def _greedy(engine: EmbeddedEngine) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_new_tokens=6)
    requests = [GenerateRequest(engine.tokenizer.encode(p), params) for p in ("hello", "2+2=", "abc")]
    return [c.token_ids for c in engine.generate_sync(requests)]


def _recipe(model_dir: Path, *overrides: str):
    from rlvr.recipe.load import load_recipe

    return load_recipe(ROOT / "recipes/quickstart.toml", [f"model.path={model_dir}", *overrides], check_files=False)


def _serve_args(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}


def test_the_kv_cache_holds_the_recipes_sequences(model_dir: Path, caplog) -> None:
    """`server_command` passes the recipe's longest sequence (prompt limit + response budget) and
    the engine allocates max_batch sequences of exactly that, and says so at start-up."""
    from rlvr.launch.argv import server_command
    from rlvr.recipe.plan import ServerSpec

    recipe = _recipe(model_dir, "data.max_prompt_tokens=40", "rollout.max_new_tokens=24", "rollout.max_batch=6")
    args = _serve_args(server_command(recipe, ServerSpec(index=0, node=0, port=1)))
    length = 40 + 24
    assert args["--max-seq-len"] == str(length) and args["--max-batch"] == "6"
    with caplog.at_level(logging.INFO, logger="rlvr.server.embedded"):
        engine = EmbeddedEngine(model_dir, max_batch=6, max_seq_len=int(args["--max-seq-len"]), device="cpu")
    try:
        config = engine.model.config
        backend = engine.backend
        kv_heads, head_dim = config.num_key_value_heads, config.head_dim
        assert backend.k_cache.shape == (config.num_hidden_layers, 6, kv_heads, length, head_dim)
        per_token = kv_bytes_per_token(config, torch.float32)
        assert per_token == 2 * config.num_hidden_layers * kv_heads * head_dim * 4
        assert backend.kv_cache_bytes == 6 * length * per_token
        line = next(r.getMessage() for r in caplog.records if "engine holds" in r.getMessage())
        weights = sum(p.numel() * 4 for p in engine.model.parameters())  # tied: counted once
        pattern = r"weights ([\d.]+) MB .* KV cache (\d+) tokens = (\d+) sequences x (\d+) tokens, ([\d.]+) MB"
        found = re.search(pattern, line)
        assert found is not None, line
        assert float(found[1]) == pytest.approx(weights / 1e6, abs=0.05)
        assert (int(found[2]), int(found[3]), int(found[4])) == (6 * length, 6, length)
        assert float(found[5]) == pytest.approx(6 * length * per_token / 1e6, abs=0.05)
    finally:
        engine.close()


def test_a_tool_episode_budget_sets_the_length(model_dir: Path) -> None:
    from rlvr.launch.argv import server_command
    from rlvr.recipe.plan import ServerSpec

    recipe = _recipe(model_dir, "data.max_prompt_tokens=30", "rollout.max_new_tokens=20")
    recipe.domains["math"].tools = ["python"]  # only a tool domain runs an episode
    recipe.domains["math"].max_episode_tokens = 90  # a tool episode's budget beats the response's
    assert _serve_args(server_command(recipe, ServerSpec(index=0, node=0, port=1)))["--max-seq-len"] == "120"
    recipe.rollout.kv_cache_gb = 0.5
    assert _serve_args(server_command(recipe, ServerSpec(index=0, node=0, port=1)))["--kv-cache-gb"] == "0.5"


def test_a_budget_lowers_the_batch_to_what_fits(model_dir: Path) -> None:
    from transformers import AutoConfig

    per_sequence = kv_bytes_per_token(AutoConfig.from_pretrained(model_dir), torch.float32) * 50
    engine = EmbeddedEngine(model_dir, max_batch=8, max_seq_len=50, device="cpu", kv_cache_bytes=3 * per_sequence + 1)
    try:
        assert engine.max_batch == 3 and engine.backend.k_cache.shape[1] == 3
        assert engine.backend.kv_cache_bytes <= 3 * per_sequence + 1
    finally:
        engine.close()
    with pytest.raises(KVBudgetError, match="holds no sequence of 50 tokens"):
        EmbeddedEngine(model_dir, max_batch=8, max_seq_len=50, device="cpu", kv_cache_bytes=per_sequence - 1)


def test_weights_read_from_the_files_and_kv_release(model_dir: Path) -> None:
    """The arena is filled from the safetensors files (not copied from the lazily mapped model):
    every weight equals a plain load's. Freeing and re-allocating the KV cache keeps generations."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = EmbeddedEngine(model_dir, max_batch=4, max_seq_len=64, device="cpu")
    try:
        served = dict(engine.model.named_parameters())
        for name, p in reference.named_parameters():
            assert torch.equal(served[name], p), name
        assert engine.weights.arena is not None
        assert served["model.embed_tokens.weight"].untyped_storage().data_ptr() == engine.weights.arena.data_ptr()
        before = _greedy(engine)
        held = engine.backend.kv_cache_bytes
        run_blocking(engine.pause("abort"))  # between sequences: nothing live holds a slot
        assert engine.backend.release_kv() == held > 0 and engine.backend.kv_cache_bytes == 0
        engine.backend.allocate_kv()
        run_blocking(engine.resume())
        assert engine.backend.kv_cache_bytes == held
        assert _greedy(engine) == before
    finally:
        engine.close()


def test_disk_update_streams_into_the_live_weights(model_dir: Path, tmp_path: Path) -> None:
    """`update_weights_from_disk` reads each tensor into its parameter (bf16 files are cast):
    the result is what `load_state_dict` of the same tensors gives, generations included."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(next(model_dir.glob("*.safetensors"))))
    torch.manual_seed(3)
    changed = {k: (v + 0.05 * torch.randn_like(v)).to(torch.bfloat16) for k, v in state.items()}
    (tmp_path / "new").mkdir()
    save_file(changed, str(tmp_path / "new" / "model.safetensors"))
    streamed = EmbeddedEngine(model_dir, max_batch=4, max_seq_len=64, device="cpu")
    loaded = EmbeddedEngine(model_dir, max_batch=4, max_seq_len=64, device="cpu")
    try:
        run_blocking(streamed.update_weights_from_disk(tmp_path / "new", version="2"))
        loaded.load_state_dict(changed, version="2")
        ours, theirs = dict(streamed.model.named_parameters()), dict(loaded.model.named_parameters())
        for name, p in theirs.items():
            assert torch.equal(ours[name], p), name
        assert _greedy(streamed) == _greedy(loaded)
        assert streamed.weight_version == "2"
        bad = {k: v[:1] if k.endswith("q_proj.weight") else v for k, v in changed.items()}
        (tmp_path / "bad").mkdir()
        save_file(bad, str(tmp_path / "bad" / "model.safetensors"))
        with pytest.raises(ValueError, match="q_proj.weight: shape"):
            run_blocking(streamed.update_weights_from_disk(tmp_path / "bad"))
        name = "model.embed_tokens.weight"  # untouched by the refused push
        assert torch.equal(dict(streamed.model.named_parameters())[name], theirs[name])
    finally:
        streamed.close()
        loaded.close()
