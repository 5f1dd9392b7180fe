"""AdapterSync (sync.lora = "adapter"): a LoRA policy pushes its adapters only, in peft's format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.recipe.schema import LoraConfig, SyncConfig
from rlvr.sync import SyncError, make_weight_sync
from rlvr.sync.adapter import AdapterSync

from .conftest import ParentClient

A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"


@pytest.fixture
def lora_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlvr.trainer.lora import apply_lora

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return apply_lora(model, LoraConfig(rank=2, alpha=4.0, target_modules=["q_proj", "v_proj"]), seed=0)


def test_a_push_writes_the_adapters_and_each_engine_loads_them_with_the_version(harness, lora_model, tmp_path: Path):
    sync = make_weight_sync(
        SyncConfig(), model=lora_model, client=ParentClient([A, B]), run_dir=tmp_path, engine_factory=harness.factory
    )
    assert isinstance(sync, AdapterSync)
    for version in (1, 2, 3):
        with torch.no_grad():
            lora_model.model.layers[0].self_attn.q_proj.lora_B["default"].weight.add_(0.5)
        metrics = sync.push(version=version)
    sync.close()
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["v2", "v3"]
    folder = tmp_path / "adapters" / "v3"
    saved = load_file(folder / "adapter_model.safetensors")
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    assert torch.equal(saved[key], lora_model.model.layers[0].self_attn.q_proj.lora_B["default"].weight.detach())
    assert all(".q_proj." in k or ".v_proj." in k for k in saved)  # the adapters, nothing of the base
    assert json.loads((folder / "adapter_config.json").read_text())["target_modules"] == ["q_proj", "v_proj"]
    assert harness.calls(A) == ["pause", "flush_cache", "load_lora_adapter", "resume"] * 3
    loads = [f for u, m, f in harness.log if m == "load_lora_adapter" and u == B]
    assert loads[-1] == {"path": str(folder), "version": 3}
    base_bytes = sum(p.numel() * 4 for n, p in lora_model.named_parameters() if ".lora_" not in n)
    assert 0 < metrics["sync/gb"] * 1e9 < base_bytes / 10


def test_a_failed_adapter_load_fails_the_push_naming_the_engine(harness, lora_model, tmp_path: Path):
    harness.behave[B] = {"load_lora_adapter": "raise"}
    sync = make_weight_sync(
        SyncConfig(), model=lora_model, client=ParentClient([A, B]), run_dir=tmp_path, engine_factory=harness.factory
    )
    with pytest.raises(SyncError, match=f"{B}.*load_lora_adapter"):
        sync.push(version=1)
    sync.close()


def test_merged_mode_pushes_full_weights_by_the_method(harness, lora_model, tmp_path: Path):
    sync = make_weight_sync(
        SyncConfig(lora="merged", method="disk"), model=lora_model, client=ParentClient([A]), run_dir=tmp_path,
        engine_factory=harness.factory,
    )  # fmt: skip
    assert not isinstance(sync, AdapterSync)
    sync.push(version=1)
    sync.close()
    saved = load_file(tmp_path / "weights" / "v1" / "model.safetensors")
    assert "model.layers.0.self_attn.q_proj.weight" in saved and not any("lora" in k for k in saved)
    assert harness.calls(A) == ["pause", "flush_cache", "update_weights_from_disk", "resume"]
