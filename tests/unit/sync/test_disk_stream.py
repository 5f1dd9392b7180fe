"""DiskSync writes the engines' dtype, streaming, and its folder serves what the old export served."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from rlvr.sync.disk import DiskSync, write_weights
from rlvr.trainer.weights import weight_names
from rlvr.weight_arena import safetensors_header

from .conftest import ParentClient

A = "http://127.0.0.1:1"


def test_disk_push_writes_the_dtype_the_engines_serve(harness, model, tmp_path: Path) -> None:
    def factory(url: str):
        engine = harness.factory(url)
        engine.info = {"dtype": "bfloat16", "tp_size": 1}
        return engine

    sync = DiskSync(model, shared_dir=tmp_path, client=ParentClient([A]), timeout_s=5, engine_factory=factory)
    with torch.no_grad():
        model.proj.weight.add_(0.123)
    sync.push(version=1)
    sync.close()
    file = tmp_path / "weights" / "v1" / "model.safetensors"
    header, _ = safetensors_header(file)
    assert {info["dtype"] for info in header.values()} == {"BF16"}
    assert list(header) == weight_names(model) == ["scale", "embed.weight", "proj.weight", "proj.bias"]  # tied once
    saved = load_file(file)
    assert torch.equal(saved["proj.weight"], model.proj.weight.detach().to(torch.bfloat16))
    assert harness.calls(A) == ["pause", "flush_cache", "update_weights_from_disk", "resume"]


def test_streamed_folder_serves_like_the_export(tmp_path: Path) -> None:
    """The same weights through `write_weights` and through `export_hf`: equal tensors, and an
    embedded engine loading either generates the same tokens."""
    from transformers import AutoModelForCausalLM

    from rlvr.bridge import run_blocking
    from rlvr.rollout.base import GenerateRequest, SamplingParams
    from rlvr.server.embedded import EmbeddedEngine
    from rlvr.tiny import build_tiny_model_dir
    from rlvr.trainer.checkpoint import export_hf

    path = build_tiny_model_dir(tmp_path / "tiny")
    trainer = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        torch.manual_seed(2)
        for p in trainer.parameters():
            p.mul_(6.0).add_(0.1 * torch.randn_like(p))  # sharp enough that greedy text varies
    write_weights(trainer, tmp_path / "streamed")
    export_hf(trainer, None, tmp_path / "exported")
    ours, theirs = load_file(tmp_path / "streamed" / "model.safetensors"), {}
    for file in (tmp_path / "exported").glob("*.safetensors"):
        theirs.update(load_file(file))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    engine = EmbeddedEngine(path, max_batch=4, device="cpu", max_seq_len=64)
    try:
        params = SamplingParams(temperature=0, max_new_tokens=8)
        requests = [GenerateRequest(engine.tokenizer.encode(p), params) for p in ("hello", "1+1=", "xyz")]
        outputs = []
        for folder in ("streamed", "exported"):
            run_blocking(engine.update_weights_from_disk(tmp_path / folder))
            outputs.append([c.token_ids for c in engine.generate_sync(requests)])
        assert outputs[0] == outputs[1]
        fresh = EmbeddedEngine(tmp_path / "streamed", max_batch=4, device="cpu", max_seq_len=64)
        try:
            assert [c.token_ids for c in fresh.generate_sync(requests)] == outputs[0]
        finally:
            fresh.close()
    finally:
        engine.close()
