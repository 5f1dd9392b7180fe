"""The quickstart with LoRA, end to end through the launcher: adapters-only pushes into `rlvr serve`,
checkpoints of adapters, export; and (slow) that it learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from .test_quickstart import ROOT, launch, metrics

LORA = ("trainer.lora.rank=8", "trainer.lr=1e-3")


def test_a_lora_run_pushes_adapters_only_and_exports_them(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from rlvr.cli import app

    result = launch(tmp_path, *LORA, "experiment.max_steps=3", "experiment.save_steps=3", "experiment.eval_steps=0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "quickstart"
    rows = metrics(run_dir)
    assert sorted(rows) == [1, 2, 3]
    policy = ROOT / "recipes" / "quickstart" / "policy"
    weights = sum(f.stat().st_size for f in policy.glob("*.safetensors"))
    for row in rows.values():  # every push carried adapters, a small share of the model's bytes
        assert 0 < row["sync/gb"] * 1e9 < weights / 5
    pushed = sorted(p.name for p in (run_dir / "adapters").iterdir())
    assert pushed == ["v2", "v3"]  # the newest two are kept
    assert not (run_dir / "weights").exists()

    out = tmp_path / "adapter"
    exported = CliRunner().invoke(app, ["export", str(run_dir), str(out)])
    assert exported.exit_code == 0, exported.output
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(policy).eval()
        ids = torch.tensor([[2, 10, 11, 12]])
        before = base(ids).logits
        tuned = PeftModel.from_pretrained(base, out).eval()(ids).logits
    assert not torch.allclose(before, tuned, atol=1e-4)  # three steps moved the adapters
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 8


@pytest.mark.slow
def test_the_quickstart_learns_with_lora(tmp_path: Path) -> None:
    steps = 40
    result = launch(tmp_path, *LORA, f"experiment.max_steps={steps}", "experiment.eval_steps=0",
                    "experiment.save_steps=0")  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    by_step = metrics(tmp_path / "quickstart")
    first = sum(by_step[s]["reward/mean"] for s in range(1, 6)) / 5
    last = sum(by_step[s]["reward/mean"] for s in range(steps - 4, steps + 1)) / 5
    assert last > first + 0.1, (first, last)
