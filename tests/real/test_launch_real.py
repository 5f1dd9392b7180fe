"""`rlvr launch` on a real pretrained model, then `rlvr eval` and `rlvr export` on its checkpoint.

tests/real/smollm2_sums.toml: SmolLM2-135M-Instruct (fp32), 2 steps of 2 prompts x 2 samples, 16 new
tokens, GRPO with KL in the loss (so a reference model is loaded), FSDP2 on one rank, broadcast
weight sync. Launched once per module; each test reads what the run left.

What only a real model can show: that the rollout's log-probs (embedded engine, KV cache, batched
decode) are the trainer's (FSDP2 forward over packed rows) to float32 rounding, before and after
a weight push; that the trainer logs what it loaded; that export writes the trained weights beside
the original tokenizer, chat template and generation config. On 2 CPU cores shared with four
other jobs (load average 8) the module took 4.5 min: the launch 190 s (steps of 121 s and 78 s,
under 90 s of CPU in all, so 1-1.5 min on a quiet machine), eval 40 s, export 26 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from rlvr.cli import app

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "tests" / "real" / "smollm2_sums.toml"
DATA = ROOT / "tests" / "real" / "data"
MAX_NEW_TOKENS = 16  # rollout.max_new_tokens of the recipe
# KL(pi_rollout || pi_old) (`mismatch_kl`, the k3 estimate over every response token, rlvr/algorithms/
# losses.py). Measured here in fp32: 4.9e-11 at step 1 and 8.9e-11 at step 2. A server still on the
# step-1 weights at step 2 would read about the policy's KL to its reference at step 2 (3.5e-4).
MISMATCH_TOL = 1e-6


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    sets = {"model.path": str(smollm2_dir), "experiment.output_dir": str(out)}
    command = [sys.executable, "-m", "rlvr.cli", "launch", str(RECIPE), "--no-dashboard"]
    command += [x for key, value in sets.items() for x in ("--set", f"{key}={json.dumps(value)}")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=840, cwd=ROOT)
    run = out / "smollm2_sums"
    assert result.returncode == 0, result.stdout + result.stderr
    assert "finished at 2/2" in result.stdout
    return run


def test_pi_old_and_the_reference_equal_the_engines_logprobs(run: Path) -> None:
    first, second = metrics(run)
    # Step 1: pi_old (the trainer's forward) against the engine's sampling log-probs, and the
    # reference against the policy (both the base weights): 0 to fp32 rounding.
    assert first["mismatch_kl"] < MISMATCH_TOL, first
    assert abs(first["kl"]) < 1e-8, first  # measured 0.0
    # Step 2: the policy moved away from the reference (kl > 0), and the engine serves the moved
    # weights (the push landed): its log-probs are still the trainer's.
    assert second["kl"] > 1e-5, second
    assert second["mismatch_kl"] < MISMATCH_TOL, second


def test_the_logs_say_what_was_loaded_and_the_kv_cache_fits_the_measured_prompts(run: Path, smollm2_dir) -> None:
    log = (run / "logs" / "trainer.log").read_text()
    assert (
        f"model: {smollm2_dir} · LlamaForCausalLM · weights float32 (model.dtype = float32) · 134.5M parameters · "
        "tied head: yes · vocab 49152 (tokenizer 49152)"
    ) in log
    assert f"reference model: loaded (a frozen copy of {smollm2_dir}, algorithm.kl_in = loss)" in log
    assert "stop: tokenizer eos 2 '<|im_end|>' · config eos 2 · generation_config eos 2 · pad 2 '<|im_end|>'" in log
    # data.max_prompt_tokens is the default 1024, but launch measured the prompts (chat template
    # included, 46 tokens at most): the server's sequences are 64 + 16 tokens, not 1024 + 16.
    from transformers import AutoTokenizer

    from rlvr.data.sources import read_rows, row_to_sample

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    longest = 0
    for file in ("sums_train.jsonl", "sums_eval.jsonl"):
        for number, row in read_rows(DATA / file):
            sample = row_to_sample(row, where=f"{file}:{number}", default_tag="sums", reward="math_rule")
            ids = tokenizer.apply_chat_template(sample.messages, add_generation_prompt=True)
            longest = max(longest, len(ids["input_ids"] if hasattr(ids, "keys") else ids))
    max_len = -(-longest // 64) * 64 + MAX_NEW_TOKENS
    assert max_len == 80
    assert f"--max-seq-len {max_len}" in (run / "logs" / "rollout-0.log").read_text()
    assert f"4 sequences x {max_len} tokens" in (run / "logs" / "rollout-0.log").read_text()


def test_the_rollout_prompt_is_the_chat_template(run: Path) -> None:
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert rows
    for row in rows:
        default = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        own = "<|im_start|>system\nYou add numbers.<|im_end|>\n"  # sums-1 has its own system message
        assert row["prompt"].startswith(own if row["id"] == "sums-1" else default), row
        assert row["prompt"].endswith("<|im_end|>\n<|im_start|>assistant\n"), row


def test_eval_scores_the_eval_rows_with_the_recipes_length_and_leaves_no_export(
    run: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(app, ["eval", str(run), "--data", str(DATA / "sums_eval.jsonl"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert f"max new tokens: {MAX_NEW_TOKENS} (rollout.max_new_tokens of {run / 'resolved_recipe.json'}" in text
    assert "(removed after the eval; --export-dir DIR keeps it)" in text
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in scored] == [f"sums-eval-{i}" for i in range(4)]
    for row in scored:
        assert row["score"] in (0.0, 1.0) and row["verdict"] == "scored", row
        assert row["finish_reason"] in ("stop", "length"), row
        assert row["prompt"].startswith("<|im_start|>system\n") and row["prompt"].endswith("<|im_start|>assistant\n")
    truncated = sum(r["finish_reason"] == "length" for r in scored)
    mean = sum(r["score"] for r in scored) / 4
    assert f"│ all │ 4 │ {mean:.3f} │ {mean:.3f} │ 0 │ {truncated} │" in text  # count mean accuracy failed truncated
    assert f"truncated: responses cut at max_new_tokens = {MAX_NEW_TOKENS}" in text
    exports = tmp_path / "cache" / "rlvr" / "exports"
    assert not exports.exists() or not any(exports.iterdir())  # the temporary export is gone


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # dcp.load(no_dist=True)
def test_export_writes_the_trained_weights_and_the_original_tokenizer(run: Path, tmp_path: Path, smollm2_dir) -> None:
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = tmp_path / "hf"
    result = CliRunner().invoke(app, ["export", str(run), str(out)])
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    # The trained weights: the checkpoint's, and not the base model's (2 steps at lr 1e-5 moved them).
    names = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.29.mlp.down_proj.weight",
    ]
    state = dict(model.named_parameters())
    saved = {f"actor.model.{name}": torch.empty_like(state[name]) for name in names}
    dcp.load(saved, checkpoint_id=str(run / "checkpoints" / "step_2"), no_dist=True)
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as base:
        for name in names:
            torch.testing.assert_close(state[name].detach(), saved[f"actor.model.{name}"], rtol=0, atol=0)
            assert not torch.equal(state[name].detach(), base.get_tensor(name)), name
    # The original tokenizer, chat template and generation config.
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (smollm2_dir / name).read_bytes(), name
    original, exported = AutoTokenizer.from_pretrained(smollm2_dir), AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    assert exported.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        original.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    )
    assert (exported.eos_token_id, exported.bos_token_id, exported.pad_token_id) == (2, 1, 2)
    generation = GenerationConfig.from_pretrained(out)
    assert (generation.eos_token_id, generation.bos_token_id, generation.pad_token_id) == (2, 1, 2)
