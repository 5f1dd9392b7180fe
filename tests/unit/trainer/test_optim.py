from __future__ import annotations

import math

import pytest
import torch

from rlvr.recipe.schema import TrainerConfig
from rlvr.trainer.optim import build_optimizer, build_scheduler, load_scheduler_state, lr_factor
from rlvr.trainer.step import update_policy


def test_warmup_then_constant():
    f = [lr_factor(s, schedule="constant", warmup_steps=4, total_steps=10, min_lr_ratio=0.0) for s in range(6)]
    assert f == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_and_linear_end_at_min_ratio():
    kw = {"warmup_steps": 2, "total_steps": 12, "min_lr_ratio": 0.1}
    assert lr_factor(2, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_factor(7, schedule="cosine", **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(12, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_factor(50, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_factor(7, schedule="linear", **kw) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(12, schedule="linear", **kw) == pytest.approx(0.1)


def test_scheduler_drives_the_optimizer_lr_and_resumes():
    cfg = TrainerConfig(lr=2e-3, lr_schedule="linear", warmup_steps=1, min_lr_ratio=0.0)
    param = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([param], cfg)
    sched = build_scheduler(opt, cfg, total_steps=5)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([2e-3, 2e-3, 1.5e-3, 1e-3, 0.5e-3])
    opt2 = build_optimizer([param], cfg)
    sched2 = build_scheduler(opt2, cfg, total_steps=5)
    load_scheduler_state(sched2, sched.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.0)


def test_the_host_heap_is_trimmed_once_before_adams_first_step(tiny_model_dir, monkeypatch) -> None:
    """glibc's heap is trimmed where Adam allocates its moments (the first optimizer step), on CPU, and
    not after later steps (that costs page faults on every next forward)."""
    from rlvr.trainer import model_trainer as engine_module

    from .conftest import build_actor, make_batch

    calls: list[int] = []
    actor = build_actor(tiny_model_dir)
    monkeypatch.setattr(engine_module, "trim_host_heap", lambda: calls.append(len(actor.optimizer.state)))
    for _ in range(3):
        update_policy(actor, make_batch())
    assert calls == [0]  # once, while Adam held no state yet
