"""`model.dtype` on a machine without GPUs: validate says the run is float32 instead of doing it silently."""

from __future__ import annotations

from pathlib import Path

from .test_model_and_rows import setup, validate

NOTE = (
    "note: model.dtype = 'bfloat16' applies on GPUs: with none here the rollout servers serve and the trainer "
    'computes in float32 (bf16 is slower on CPUs); set model.dtype = "float32" to say so'
)


def test_a_bf16_recipe_on_a_cpu_machine_gets_one_note(tmp_path: Path) -> None:
    path = setup(tmp_path)
    result = validate(path, "model.dtype=bfloat16")
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().splitlines() == [NOTE]
    result = validate(path, "model.dtype=float32")
    assert result.exit_code == 0, result.output
    assert "note:" not in result.stderr


def test_no_note_where_a_gpu_is_visible(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("rlvr.recipe.checks.visible_gpus", lambda: 1)
    from rlvr.recipe.checks import cpu_dtype_note
    from rlvr.recipe.load import load_recipe

    assert cpu_dtype_note(load_recipe(setup(tmp_path), ["model.dtype=bfloat16"])) is None
