"""The recipe keys of model.impl = "torchtitan": one-line errors for splits that cannot run, dp x tp in `rlvr plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.recipe.load import RecipeError, load_recipe
from rlvr.tiny import tiny_config
from tests.unit.recipe.helpers import MINIMAL, write_recipe

TITAN = MINIMAL.replace(
    "config = {{ hidden_size = 32 }}",
    'config = {{ model_type = "qwen3", num_attention_heads = 4, num_key_value_heads = 2 }}\nimpl = "torchtitan"',
)


def load(tmp_path: Path, *overrides: str, body: str = TITAN):
    return load_recipe(write_recipe(tmp_path, body), list(overrides))


def error(tmp_path: Path, *overrides: str, body: str = TITAN) -> str:
    with pytest.raises(RecipeError) as info:
        load(tmp_path, *overrides, body=body)
    return str(info.value)


def test_a_key_the_schema_lacks_is_named_with_the_keys_it_has(tmp_path: Path) -> None:
    message = error(tmp_path, "model.use_torchtitan=true", body=MINIMAL)
    assert message.startswith("--set model.use_torchtitan: unknown key; known keys: path,") and "impl" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["trainer.tp_size=2"], "trainer.tp_size: 2 does not divide the 1 trainer ranks"),
        (
            ["trainer.ranks=4", "trainer.tp_size=4"],
            "trainer.tp_size: 4 does not divide the model's num_key_value_heads = 2",
        ),
        (
            ["trainer.ranks=6", "trainer.tp_size=3"],
            "trainer.tp_size: 3 does not divide the model's num_attention_heads = 4",
        ),
        (
            ["trainer.ranks=2", "trainer.tp_size=2", "trainer.strategy=none"],
            "tensor parallel needs trainer.strategy = 'fsdp2'",
        ),
        (
            ["trainer.ranks=2", "trainer.tp_size=2", "algorithm.preset=ppo"],
            "the torchtitan critic runs without tensor parallel",
        ),
        (["model.impl=hf", "trainer.ranks=2", "trainer.tp_size=2"], "trainer.tp_size: needs model.impl = 'torchtitan'"),
        (["model.impl=hf", "trainer.compile=true"], "trainer.compile: needs model.impl = 'torchtitan'"),
        (
            ["model.impl=hf", "trainer.activation_checkpointing=selective"],
            "'selective' needs model.impl = 'torchtitan'",
        ),
    ],
)
def test_splits_that_cannot_run_are_rejected(tmp_path: Path, overrides: list[str], expected: str) -> None:
    assert expected in error(tmp_path, *overrides)


def test_gpus_per_node_must_hold_whole_tp_groups(tmp_path: Path) -> None:
    slurm = ["cluster.kind=slurm", "cluster.nodes=2", "cluster.gpus_per_node=6", "trainer.tp_size=4"]
    assert "does not divide cluster.gpus_per_node = 6" in error(tmp_path, *slurm)


def test_the_model_folder_config_is_checked(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_config(vocab_size=64, heads=6, kv_heads=3)))
    body = MINIMAL.replace("config = {{ hidden_size = 32 }}", 'path = "model"\nimpl = "torchtitan"')
    assert "num_attention_heads = 6" in error(tmp_path, "trainer.ranks=4", "trainer.tp_size=4", body=body)
    (folder / "config.json").write_text(json.dumps(tiny_config(vocab_size=64) | {"model_type": "gpt2"}))
    assert "torchtitan runs qwen3 and llama models, not 'gpt2'" in error(tmp_path, body=body)


def test_plan_shows_the_dp_by_tp_mesh(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, TITAN)
    result = CliRunner().invoke(app, ["plan", str(recipe), "--set", "trainer.ranks=4", "--set", "trainer.tp_size=2"])
    assert result.exit_code == 0, result.output
    assert "dp 2 x tp 2" in result.output
    assert load(tmp_path, "trainer.ranks=4", "trainer.tp_size=2", "trainer.activation_checkpointing=selective")
