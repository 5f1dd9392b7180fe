"""The RL loop end to end with tool turns: a real tiny actor, the embedded engine in process, and
a tool domain whose every episode makes two calls. The trainer consumes the per-token masks (tool
tokens masked out), also with k = 1, where weight pushes may abort episodes between or inside tool turns."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch

from rlvr.collect.manager import RolloutManager
from rlvr.loop import RLLoop
from rlvr.monitor.metrics import RunRecorder
from rlvr.recipe.schema import Recipe
from rlvr.server.embedded import EmbeddedEngine
from rlvr.sync.inprocess import InProcessSync
from rlvr.tools.formats import ToolCall
from rlvr.trainer.actor import Actor
from rlvr.types import Group, RewardResult, Sample
from tests.unit.tools.plugin_example import lookup_price

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class EveryTokenCalls:
    """A format whose stop strings are every printable character: each model turn is one token and
    calls `lookup_price` (answer "3" in <r>...</r>) until max_turns."""

    stop = list(string.printable)

    def parse(self, text: str):
        return ToolCall("lookup_price", {"item": "apple"})

    def render(self, answer: str) -> str:
        return f"<r>{answer}</r>"

    def instructions(self) -> str:
        return "tools: lookup_price"


class SpreadReward:
    """Scores that differ between samples (so advantages are not all zero); what they reward is irrelevant here."""

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        for group in groups:
            group.rewards = [RewardResult(sum(map(ord, c.text)) % 7 / 6) for c in group.completions]
        return {}

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlvr.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tools-loop") / "tiny")


def make_loop(
    run_dir: Path, model_dir: Path, *, steps: int, k: int = 0, save_steps: int = 0, max_batch: int = 32
) -> RLLoop:
    recipe = Recipe.model_validate({
        "experiment": {"max_steps": steps, "save_steps": save_steps, "seed": 0},
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"prompts_per_step": 2},
        "domains": {"toy": {"tags": ["toy"], "files": ["x"], "reward": "math_rule", "max_turns": 3,
                            "tools": ["tests.unit.tools.plugin_example:lookup_price"], "max_episode_tokens": 40}},
        "rollout": {"n": 2, "max_new_tokens": 12, "max_staleness": k},
        "trainer": {"strategy": "none", "lr": 3e-3, "micro_batch_size": 4},
        "algorithm": {"preset": "grpo", "kl_in": "none", "kl_coef": 0.0, "tis_cap": 2.0},
    })  # fmt: skip
    actor = Actor.build(
        recipe.model, recipe.trainer, recipe.algorithm, total_steps=steps, device=torch.device("cpu"), seed=0
    )
    engine = EmbeddedEngine(model_dir, max_batch=max_batch, device="cpu")
    prompts = [Sample(id=f"p{i}", tag="toy", domain="toy", messages=[{"role": "user", "content": f"say {w}"}])
               for i, w in enumerate(["hi", "ok", "yes", "no", "cat", "dog"])]  # fmt: skip
    manager = RolloutManager(recipe, train={"toy": prompts}, evals={}, tokenizer=engine.tokenizer, client=engine,
                             rewards=SpreadReward())  # type: ignore[arg-type]  # fmt: skip
    manager.toolboxes["toy"].format = EveryTokenCalls()  # type: ignore[assignment]
    return RLLoop(recipe, run_dir=run_dir, actor=actor, critic=None, manager=manager,
                  sync=InProcessSync(actor.model, engine=engine, bucket_mb=16),
                  recorder=RunRecorder(run_dir, max_steps=steps), pad_id=0)  # fmt: skip


def run(loop: RLLoop, *, resume: str = "none") -> list[dict]:
    try:
        loop.resume(resume)
        if loop.step and loop.sync is not None:
            loop.sync.push(version=loop.step)  # what the worker does for fresh engines
        assert loop.run() == 0
    finally:
        loop.manager.close()  # type: ignore[union-attr]
        loop.recorder.close("finished")  # type: ignore[union-attr]
    return [json.loads(line) for line in (loop.run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(loop: RLLoop) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in loop.actor.model.state_dict().items()}


@pytest.mark.parametrize("k", [0, 1])
def test_the_loop_trains_on_tool_episodes(tmp_path: Path, model_dir: Path, k: int) -> None:
    assert lookup_price("apple") == "3"
    loop = make_loop(tmp_path, model_dir, steps=3, k=k)
    before = weights(loop)
    metrics = run(loop)
    assert len(metrics) == 3
    for m in metrics:
        assert m["turns/toy"] == 3.0 and m["tools/toy/calls_per_episode"] == 2.0 and m["tools/toy/errors"] == 0.0
        assert all(v == v and abs(v) != float("inf") for v in m.values() if isinstance(v, float))  # no NaN/inf
    if k == 1:
        assert all(m["rollout/staleness_max"] <= 1 for m in metrics)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 2, 2, 3, 3]  # monitor.log_samples = 2 (default) per step
    for s in samples:
        assert s["prompt"].startswith("system: tools: lookup_price\nuser: say ")
        assert s["completion"].count("<r>3</r>") == 2 and (s["turns"], s["tool_calls"]) == (3, 2)
    after = weights(loop)
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_resume_in_the_middle_of_tool_training_gives_the_same_weights(tmp_path: Path, model_dir: Path) -> None:
    """Bit-identical only with one sequence per engine batch: a turn's request joins whatever batch
    is decoding when its tool returns (timing), and batched logits differ at float rounding."""
    straight = make_loop(tmp_path / "a", model_dir, steps=3, max_batch=1)
    run(straight)
    run(make_loop(tmp_path / "b", model_dir, steps=1, save_steps=1, max_batch=1))
    second = make_loop(tmp_path / "b", model_dir, steps=3, max_batch=1)
    metrics = run(second, resume="auto")
    assert metrics[-1]["step"] == 3 and metrics[-1]["turns/toy"] == 3.0
    a, b = weights(straight), weights(second)
    assert all(torch.equal(a[name], b[name]) for name in a)
