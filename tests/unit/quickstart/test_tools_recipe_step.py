"""One RL step of recipes/tools.toml in process, with its shipped policy, data, corpus and rewards:
both domains run real tool episodes (the python sandbox and BM25 search), the trainer takes the
step, and samples.jsonl shows whole episodes. The learning run itself is the slow
tests/integration/test_tools_quickstart.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlvr.collect.manager import RolloutManager
from rlvr.data.sources import load_recipe_domains
from rlvr.loop import RLLoop
from rlvr.monitor.metrics import RunRecorder
from rlvr.recipe.load import load_recipe
from rlvr.rewards.pool import RewardPool
from rlvr.server.embedded import EmbeddedEngine
from rlvr.sync.inprocess import InProcessSync
from rlvr.trainer.actor import Actor

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_one_step_of_the_tools_recipe(tmp_path: Path) -> None:
    overrides = ["experiment.max_steps=1", "experiment.eval_steps=0", "data.prompts_per_step=4", "rollout.n=4"]
    overrides += ["trainer.micro_batch_size=16", 'trainer.strategy="none"']
    recipe = load_recipe(ROOT / "recipes" / "tools.toml", overrides)
    actor = Actor.build(
        recipe.model, recipe.trainer, recipe.algorithm, total_steps=1, device=torch.device("cpu"), seed=0
    )
    engine = EmbeddedEngine(recipe.model.path, max_batch=16, device="cpu")
    train, _ = load_recipe_domains(recipe)
    rewards = RewardPool.from_domains({name: (d.reward, d.reward_args) for name, d in recipe.domains.items()})
    manager = RolloutManager(recipe, train=train, evals={}, tokenizer=engine.tokenizer, client=engine, rewards=rewards)
    loop = RLLoop(recipe, run_dir=tmp_path, actor=actor, manager=manager,
                  sync=InProcessSync(actor.model, engine=engine, bucket_mb=16),
                  recorder=RunRecorder(tmp_path, max_steps=1), pad_id=0)  # fmt: skip
    try:
        assert loop.run() == 0
    finally:
        manager.close()
        loop.recorder.close("finished")  # type: ignore[union-attr]
    (metrics,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for domain in ("math", "facts"):
        assert f"reward/{domain}/mean" in metrics and f"tools/{domain}/call_rate" in metrics
        assert metrics[f"tools/{domain}/errors"] == 0 and metrics[f"tools/{domain}/timeouts"] == 0
    assert metrics["tools/math/calls_per_episode"] + metrics["tools/facts/calls_per_episode"] > 0
    assert math.isfinite(metrics["loss"])
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["domain"] for s in samples}) == ["facts", "math"] and len(samples) == 4
    for s in samples:
        assert s["prompt"].startswith("user: ") and s["turns"] == 1 + s["tool_calls"]
        if s["tool_calls"]:
            assert "\n<result>\n" in s["completion"]
