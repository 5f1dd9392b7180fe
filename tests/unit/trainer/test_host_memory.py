"""The CPU trainer's allocator setting: freed large tensors go back to the OS.

Checked through glibc's own accounting (`mallinfo2().hblkhd`, bytes in mmapped blocks), not
RSS: after an 8 MiB block is freed, glibc's default dynamic threshold puts a 4 MiB block in
the heap (where, once freed, it stays resident); pinned, the 4 MiB block is its own mapping.
Each case runs in a fresh interpreter because the setting is process-wide.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt / mallinfo2")

PROBE = r"""
import ctypes, sys, torch
from rlvr.trainer.model import keep_large_frees_returning_to_os
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
if sys.argv[1] == "pin":
    assert keep_large_frees_returning_to_os()
big = torch.ones(8 << 20, dtype=torch.uint8)
del big  # freeing a mapped block raises glibc's dynamic mmap threshold to its size
before = libc.mallinfo2().hblkhd
block = torch.ones(4 << 20, dtype=torch.uint8)
print("MAPPED", libc.mallinfo2().hblkhd - before >= 4 << 20)
"""


def _mapped(mode: str) -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("MAPPED ")]
    if not lines:
        if "mallinfo2" in out.stderr:
            pytest.skip("no glibc mallinfo2 here")
        raise AssertionError(out.stderr[-2000:])
    return lines[-1] == "MAPPED True"


def test_pinned_threshold_maps_blocks_after_a_large_free():
    assert _mapped("pin")


def test_default_allocator_keeps_such_blocks_in_the_heap():
    """The control: without the pin the same block lands in the heap, so the test above
    measures the setting, not the allocator's defaults."""
    assert not _mapped("default")


def test_build_model_pins_it_for_a_trainable_cpu_model(monkeypatch):
    from rlvr.recipe.schema import ModelConfig, TrainerConfig
    from rlvr.trainer import model as m

    calls: list[int] = []
    monkeypatch.setattr(m, "keep_large_frees_returning_to_os", lambda: calls.append(1) or True)
    config = {
        "model_type": "qwen3",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
    }
    cfg, trainer = ModelConfig(config=config), TrainerConfig(strategy="none", lr=1e-3)
    m.build_model(cfg, trainer, device=torch.device("cpu"), trainable=False)
    assert calls == []
    m.build_model(cfg, trainer, device=torch.device("cpu"))
    assert calls == [1]
