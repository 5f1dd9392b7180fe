"""What the matrix does not cover: refused in one line before anything starts, or run on transformers'
own attention and masks with a one-line note; and the families that used to fail now start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.recipe.families import FAMILIES
from tests.unit.recipe.helpers import MINIMAL, one_error_line, write_recipe
from tests.unit.trainer.conftest import build_actor

from .configs import BASE, WINDOW, build_folder
from .test_trainer_exact import grouped, load, reference, worst

UNCHECKED = "cohere2"  # windowed layers, outside the matrix


def recipe_with(tmp_path: Path, config: dict, *extra: str) -> Path:
    body = MINIMAL.replace("config = {{ hidden_size = 32 }}", "config = " + toml_inline(config))
    return write_recipe(tmp_path, body + "\n".join(extra))


def toml_inline(config: dict) -> str:
    inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in config.items() if v is not None and not isinstance(v, dict))
    return "{{ " + inner + " }}"


def test_a_family_outside_the_matrix_is_a_one_line_note(tmp_path: Path) -> None:
    assert UNCHECKED not in FAMILIES
    path = recipe_with(tmp_path, {**BASE, "max_position_embeddings": 4096, "vocab_size": 100, "model_type": UNCHECKED})
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if "conformance matrix" in line]
    assert len(notes) == 1 and f"model_type '{UNCHECKED}' is not in rlvr's conformance matrix" in notes[0]


def test_a_family_in_the_matrix_gets_no_note(tmp_path: Path) -> None:
    path = recipe_with(tmp_path, {**BASE, "max_position_embeddings": 4096, "vocab_size": 100, "model_type": "gemma2"})
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0 and "conformance matrix" not in result.output, result.output


def test_torchtitan_with_a_window_is_refused_in_one_line(tmp_path: Path) -> None:
    config = {
        **BASE,
        "max_position_embeddings": 4096,
        "vocab_size": 100,
        "model_type": "qwen3",
        "use_sliding_window": True,
        "sliding_window": WINDOW,
    }
    path = recipe_with(tmp_path, config)
    result = CliRunner().invoke(app, ["validate", str(path), "--set", "model.impl=torchtitan"])
    line = one_error_line(result)
    assert line.endswith(
        f"model.impl: qwen3: sliding-window attention (sliding_window = {WINDOW}) is not supported by "
        "model.impl = 'torchtitan' (its attention has no window); set model.impl = 'hf'"
    ), line


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss", UNCHECKED])
def test_the_actor_starts_and_its_logprobs_are_exact(family: str, family_root: Path, tmp_path: Path) -> None:
    """Gemma 2 and gpt-oss used to die at trainer start (transformers refuses a "*sdpa*" attention for
    them); a family outside the matrix trains unpacked on transformers' own sdpa and masks."""
    if family == UNCHECKED:
        from tests.unit.families import configs

        configs.CONFIGS.setdefault(UNCHECKED, {"sliding_window": WINDOW})
    folder = build_folder(family, family_root)
    batch = grouped()
    actor = build_actor(folder, packing=True, share_prompts=True, max_tokens_per_micro_batch=96)
    expected = "rlvr_packed" if family in FAMILIES else "sdpa"
    assert actor.trainer.attn_implementation == expected
    assert actor.trainer.packing == (family in FAMILIES)
    logp, _ = actor.compute_logprobs(batch)
    with torch.no_grad():
        ref, _ = reference(load(folder, "eager"), batch)
    got = [logp[i, : int(batch.response_lens[i])] for i in range(len(batch))]
    assert worst(got, ref) < 1e-5


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "deepseek_v3"])
def test_a_family_vllm_would_serve_stale_after_a_push_is_refused_with_vllm(tmp_path: Path, family: str) -> None:
    from tests.unit.families.configs import CONFIGS

    config = {**BASE, "max_position_embeddings": 4096, "vocab_size": 100, "model_type": family, **CONFIGS[family]}
    path = recipe_with(tmp_path, config)
    line = one_error_line(CliRunner().invoke(app, ["validate", str(path), "--set", "rollout.engine=vllm"]))
    assert f"rollout.engine: {family}: " in line and line.endswith("use rollout.engine = 'embedded'"), line


def test_a_partial_window_is_refused_with_vllm(tmp_path: Path) -> None:
    from tests.unit.families.configs import CONFIGS

    config = {**BASE, "max_position_embeddings": 4096, "vocab_size": 100, "model_type": "qwen2", **CONFIGS["qwen2"]}
    line = one_error_line(CliRunner().invoke(app, ["validate", str(recipe_with(tmp_path, config)),
                                                   "--set", "rollout.engine=vllm"]))  # fmt: skip
    assert line.endswith(
        "rollout.engine: qwen2: vLLM refuses a sliding window on only some layers (max_window_layers = 2 of 4); "
        "use rollout.engine = 'embedded'"
    ), line


def test_a_head_too_small_for_vllms_cpu_attention_is_refused_on_the_cpu_only(tmp_path: Path) -> None:
    """vLLM-CPU's attention takes head_dim >= 32: a smaller one would serve /health and die on the first
    request. On GPUs (cluster.gpus_per_node > 0) it is not this check's business."""
    config = {**BASE, "max_position_embeddings": 4096, "vocab_size": 100, "model_type": "llama", "head_dim": 16}
    path = recipe_with(tmp_path, config)
    line = one_error_line(CliRunner().invoke(app, ["validate", str(path), "--set", "rollout.engine=vllm"]))
    assert line.endswith(
        "rollout.engine: vLLM's CPU attention needs head_dim >= 32, this model's is 16 (the server would report "
        "healthy and die on the first request); use rollout.engine = 'embedded'"
    ), line
    wide = recipe_with(tmp_path, {**config, "head_dim": 32})
    assert CliRunner().invoke(app, ["validate", str(wide), "--set", "rollout.engine=vllm"]).exit_code == 0
