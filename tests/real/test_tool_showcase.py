"""The two real-model tool recipes launch, call their tool and finish (one small step each).

recipes/smollm2_python_tool.toml and recipes/smollm2_search_tool.toml on SmolLM2-135M-Instruct:
one step of 2 prompts x 8 samples (T = 1 and T = 0.7), no eval. SmolLM2 writes the prompt's
example call in about a third of its products samples and a search in most of its mayors samples
(docs/tools.md#a-real-model-learns-to-call-tools), so 16 episodes without a call are all but
impossible; the run is seeded, so the draw is the same every time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "experiment.max_steps": 1,
    "experiment.eval_at_start": False,
    "experiment.eval_steps": 0,
    "data.prompts_per_step": 2,
    "rollout.n": 8,
    "trainer.micro_batch_size": 16,
}


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "domain"), [("smollm2_python_tool", "products"), ("smollm2_search_tool", "mayors")])
def test_the_recipe_calls_its_tool_and_finishes(recipe: str, domain: str, smollm2_dir: Path, tmp_path: Path) -> None:
    sets = TINY | {"model.path": str(smollm2_dir), "experiment.output_dir": str(tmp_path)}
    command = [sys.executable, "-m", "rlvr.cli", "launch", f"recipes/{recipe}.toml", "--no-dashboard"]
    command += [x for key, value in sets.items() for x in ("--set", f"{key}={json.dumps(value)}")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=840, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "finished at 1/1" in result.stdout
    (row,) = [json.loads(line) for line in (tmp_path / recipe / "metrics.jsonl").read_text().splitlines()]
    assert row[f"tools/{domain}/calls_per_episode"] > 0, row
    assert row[f"turns/{domain}"] > 1, row
    assert f"tools/{domain}/errors" in row
