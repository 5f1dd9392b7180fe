from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlvr.rundir import latest_checkpoint
from rlvr.trainer import checkpoint as ckpt
from rlvr.trainer.checkpoint import export_hf, load_checkpoint, prune, save_checkpoint
from rlvr.trainer.step import update_policy

from .conftest import build_actor, make_batch


def _params(actor):
    return {n: p.detach().clone() for n, p in actor.model.named_parameters()}


def test_resume_continues_bit_identically(tiny_model_dir, tmp_path):
    batch = make_batch()
    a = build_actor(tiny_model_dir, lr_schedule="cosine", warmup_steps=2)
    update_policy(a, batch)
    save_checkpoint(tmp_path, 1, {"actor": a}, extra={"step": 1, "mixture": {"cursor": 7}})
    later = [update_policy(a, batch)["loss"] for _ in range(2)]

    b = build_actor(tiny_model_dir, lr_schedule="cosine", warmup_steps=2)
    extra = load_checkpoint(latest_checkpoint(tmp_path) or "", {"actor": b})
    assert extra == {"step": 1, "mixture": {"cursor": 7}}
    assert [update_policy(b, batch)["loss"] for _ in range(2)] == later
    assert b.optimizer.param_groups[0]["lr"] == a.optimizer.param_groups[0]["lr"]
    pa, pb = _params(a), _params(b)
    assert all(torch.equal(pa[n], pb[n]) for n in pa)


def test_keep_last_and_latest_pointer(tiny_model_dir, tmp_path):
    a = build_actor(tiny_model_dir)
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, {"actor": a}, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_3", "step_4"]
    assert (tmp_path / "latest").read_text() == "step_4"
    assert latest_checkpoint(tmp_path) == tmp_path / "step_4"
    (tmp_path / "latest").unlink()  # a lost pointer still resumes from the newest complete folder
    assert latest_checkpoint(tmp_path) == tmp_path / "step_4"
    assert latest_checkpoint(tmp_path / "nothing-here") is None
    assert prune(tmp_path, keep_last=1) == [tmp_path / "step_3"]


def test_a_failed_save_leaves_the_previous_checkpoint_usable(tiny_model_dir, tmp_path, monkeypatch):
    a = build_actor(tiny_model_dir)
    save_checkpoint(tmp_path, 1, {"actor": a}, keep_last=1)
    update_policy(a, make_batch())
    real = ckpt._write_dcp

    def crash(state, path):
        real(state, path)  # shards on disk, then the process "dies" before the commit
        raise RuntimeError("killed mid-save")

    monkeypatch.setattr(ckpt, "_write_dcp", crash)
    with pytest.raises(RuntimeError, match="killed"):
        save_checkpoint(tmp_path, 2, {"actor": a}, keep_last=1)
    assert (tmp_path / "step_2.tmp").exists() and not (tmp_path / "step_2").exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_1"
    b = build_actor(tiny_model_dir)
    load_checkpoint(tmp_path / "step_1", {"actor": b})
    monkeypatch.setattr(ckpt, "_write_dcp", real)
    save_checkpoint(tmp_path, 2, {"actor": a}, keep_last=1)  # the next save clears the debris
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_2"]


KILL_SCRIPT = """
import sys, time, torch
sys.path.insert(0, {root!r})
from tests.unit.trainer.conftest import build_actor
from rlvr.trainer import checkpoint as ckpt
a = build_actor({model!r})
ckpt.save_checkpoint({out!r}, 1, {{"actor": a}})
real = ckpt._write_dcp
def slow(state, path):
    real(state, path)
    open({marker!r}, "w").close()
    time.sleep(120)
ckpt._write_dcp = slow
ckpt.save_checkpoint({out!r}, 2, {{"actor": a}})
"""


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint(tiny_model_dir, tmp_path):
    out, marker = tmp_path / "ckpt", tmp_path / "writing"
    root = str(Path(__file__).resolve().parents[3])
    script = KILL_SCRIPT.format(root=root, model=str(tiny_model_dir), out=str(out), marker=str(marker))
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, "the saving process died on its own"
            assert time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert latest_checkpoint(out) == out / "step_1"
    load_checkpoint(out / "step_1", {"actor": build_actor(tiny_model_dir)})


def test_export_hf_reloads_with_equal_logits(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.recipe.schema import ModelConfig
    from rlvr.trainer.model import load_tokenizer

    a = build_actor(tiny_model_dir)
    update_policy(a, make_batch())  # weights differ from the folder we started from
    tokenizer = load_tokenizer(ModelConfig(path=str(tiny_model_dir)))
    out = export_hf(a.model, tokenizer, tmp_path / "hf")
    assert out is not None and (out / "model.safetensors").exists() and not (tmp_path / "hf.tmp").exists()
    assert "rlvr_packed" not in (out / "config.json").read_text()  # loadable without rlvr
    loaded = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[5, 17, 30, 42, 8, 9]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, a.model(ids).logits)
    assert AutoTokenizer.from_pretrained(out)("ab")["input_ids"] == tokenizer("ab")["input_ids"]
