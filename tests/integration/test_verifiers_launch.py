"""`rlvr launch` of a recipe with a verifiers taskset domain (a module beside the recipe) and a hub data
set domain (`hf:rlvr-test/sums` in a hub cache under tmp, offline): both train for two steps on the CPU
with the tiny quickstart policy, the taskset's named rewards and metrics are logged per step, and its
eval split is scored at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")  # the dev extra installs it; `pip install -e '.[verifiers]'`

from tests.unit.data.test_hub_data import add_dataset, table  # noqa: E402
from tests.unit.rewards.verifiers_tasksets import write_tasksets  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "recipes" / "quickstart" / "policy"

RECIPE = """
[experiment]
name = "vf"
output_dir = "{out}"
max_steps = 2
save_steps = 0
eval_steps = 2

[model]
path = "{policy}"
dtype = "float32"
chat_template = "auto"

[data]
prompts_per_step = 4
domain_interleave_probs = {{ sums = 0.5, hub = 0.5 }}
max_prompt_tokens = 128

[domains.sums]
tags = ["sums"]
reward = "verifiers"

[domains.sums.verifiers]
taskset = "toy_sums"
args = {{ n = 16 }}
eval_args = {{ split = "test", n = 4 }}

[domains.hub]
tags = ["hub"]
files = ["hf:rlvr-test/sums"]
eval_files = ["hf:rlvr-test/sums"]
reward = "math_rule"

[domains.hub.hf]
config = "main"
columns = {{ prompt = "question", ground_truth = "answer" }}

[algorithm]
preset = "grpo"
kl_coef = 0.0
kl_in = "none"

[rollout]
engine = "embedded"
n = 4
temperature = 1.0
max_new_tokens = 16
servers = 1

[trainer]
strategy = "fsdp2"
ranks = 1
lr = 2e-4
micro_batch_size = 16

[cluster]
kind = "local"
"""


@pytest.mark.slow  # about 60 s on 2 cores
def test_a_verifiers_domain_and_a_hub_data_set_train_through_launch(tmp_path: Path) -> None:
    folder = write_tasksets(tmp_path / "recipe")
    recipe = folder / "vf.toml"
    recipe.write_text(textwrap.dedent(RECIPE).format(out=tmp_path / "runs", policy=POLICY))
    cache = tmp_path / "hub"
    files = {"main/train-00000-of-00001.parquet": table(16), "main/test-00000-of-00001.parquet": table(4, start=100)}
    add_dataset(cache, "rlvr-test/sums", files)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("RLVR_PLUGIN_PATH", None)
    result = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "launch", str(recipe), "--no-dashboard"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # the taskset module is found beside the recipe, not in the working folder
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "runs" / "vf"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward/sums/count" in line or "reward/hub/count" in line]
    assert len(steps) == 2
    judged = [line for line in steps if "reward/sums/count" in line]
    assert judged and all(line["reward/sums/failed"] == 0 for line in judged)
    assert all({"reward/sums/sub/correct", "reward/sums/sub/chars"} <= set(line) for line in judged)
    assert any(line.get("reward/hub/count", 0) > 0 for line in steps)
    evals = [line for line in lines if any(k.startswith("eval/reward/sums/") for k in line)]
    assert evals and any("eval/reward/hub/mean" in line for line in evals)
    assert result.stdout.strip().splitlines()[-1] == f"finished at 2/2; results in {run}"
