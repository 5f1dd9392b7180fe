"""DiskSync against recording fake engines; InProcessSync into a real EmbeddedEngine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.recipe.schema import SyncConfig
from rlvr.sync import SyncError, make_weight_sync
from rlvr.sync.disk import DiskSync
from rlvr.sync.inprocess import InProcessSync

from .conftest import ParentClient

A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"


def test_disk_writes_a_folder_loads_it_with_the_version_and_keeps_two(harness, model, tmp_path: Path) -> None:
    client = ParentClient([A, B])
    sync = DiskSync(model, shared_dir=tmp_path, client=client, timeout_s=5, engine_factory=harness.factory)
    for version in (1, 2, 3):
        with torch.no_grad():
            model.proj.weight.add_(1.0)
        metrics = sync.push(version=version)
    sync.close()
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]
    saved: dict[str, torch.Tensor] = {}
    for file in (tmp_path / "weights" / "v3").glob("*.safetensors"):
        saved.update(load_file(file))
    assert torch.equal(saved["proj.weight"], model.proj.weight.detach())
    assert harness.calls(A) == ["pause", "flush_cache", "update_weights_from_disk", "resume"] * 3
    loads = [f for u, m, f in harness.log if m == "update_weights_from_disk" and u == B]
    assert loads[-1] == {"path": str(tmp_path / "weights" / "v3"), "version": 3}
    assert metrics["sync/engines"] == 2 and metrics["sync/gb"] > 0


def test_disk_fail_and_continue_modes(harness, model, tmp_path: Path) -> None:
    harness.behave[B] = {"update_weights_from_disk": "raise"}
    failing = DiskSync(model, shared_dir=tmp_path, client=ParentClient([A, B]), engine_factory=harness.factory)
    with pytest.raises(SyncError, match=f"{B}.*update_weights_from_disk"):
        failing.push(version=1)
    failing.close()
    client = ParentClient([A, B])
    going_on = DiskSync(
        model, shared_dir=tmp_path, client=client, on_engine_failure="continue", engine_factory=harness.factory
    )
    metrics = going_on.push(version=2)
    assert metrics["sync/engines"] == 1 and client.live_servers == [A]
    assert harness.calls(A)[-1] == "resume" and harness.calls(B)[-1] == "update_weights_from_disk"
    going_on.close()


def test_inprocess_copies_into_an_embedded_engine(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rlvr.rollout.base import GenerateRequest, SamplingParams
    from rlvr.server.embedded import EmbeddedEngine
    from rlvr.tiny import build_tiny_model_dir

    path = build_tiny_model_dir(tmp_path / "tiny")
    trainer = AutoModelForCausalLM.from_pretrained(path)
    engine = EmbeddedEngine(path, max_batch=2, device="cpu", max_seq_len=64)
    try:
        with torch.no_grad():
            torch.manual_seed(1)
            for p in trainer.parameters():
                p.add_(torch.randn_like(p))
        sync = make_weight_sync(SyncConfig(bucket_mb=1), model=trainer, engine=engine)
        assert isinstance(sync, InProcessSync)
        sync.push(version=9)
        served = dict(engine.model.named_parameters())
        for name, p in trainer.named_parameters():
            assert torch.equal(served[name], p), name
        out = engine.generate_sync([GenerateRequest([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=3))])
        assert out[0].policy_version == 9 and not engine.paused
        sync.close()
    finally:
        engine.close()


def test_factory_picks_broadcast_and_disk(harness, model, tmp_path: Path) -> None:
    from rlvr.sync.broadcast import BroadcastSync

    client = ParentClient([A])
    sync = make_weight_sync(SyncConfig(), model=model, client=client, engine_factory=harness.factory)
    assert isinstance(sync, BroadcastSync)
    sync.close()
    disk = make_weight_sync(SyncConfig(method="disk"), model=model, client=client, run_dir=tmp_path)
    assert isinstance(disk, DiskSync) and disk.root == tmp_path / "weights"
    disk.close()
    with pytest.raises(ValueError, match="shared_dir"):
        make_weight_sync(SyncConfig(method="disk"), model=model, client=client)
