"""The RL loop end to end in one process: a real tiny actor (and critic), the embedded engine in
process with in-process weight sync, the rollout manager, and a reward the policy can move.

Covers what only the quickstart used to run: PPO with a critic (GAE) and KL in the reward, KL in
the loss with the adaptive controller and its state across a resume, several PPO epochs, a step
whose every group is filtered, resume after dynamic-sampling refills (bit-identical weights), and
the asynchronous loop (k = 1) with partial rollouts and the off-policy correction.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import rlvr.trainer.step as step_module
from rlvr.collect.manager import RolloutManager
from rlvr.loop import RLLoop
from rlvr.monitor.metrics import RunRecorder
from rlvr.recipe.schema import Recipe
from rlvr.server.embedded import EmbeddedEngine
from rlvr.sync.inprocess import InProcessSync
from rlvr.trainer.actor import Actor
from rlvr.trainer.critic import Critic
from rlvr.types import GROUP_ENDS, Group, RewardResult, Sample

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class VowelReward:
    """Share of vowels in the response (a dense, learnable signal); `flat` makes every score 1."""

    def __init__(self, flat: bool = False) -> None:
        self.flat = flat

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        for group in groups:
            group.rewards = [
                RewardResult(1.0 if self.flat else sum(ch in "aeiou" for ch in c.text) / max(len(c.text), 1))
                for c in group.completions
            ]
        return {"reward/toy/count": float(sum(len(g.completions) for g in groups))}

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlvr.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("loop") / "tiny")


def make_loop(run_dir: Path, model_dir: Path, *, steps: int = 3, k: int = 0, flat: bool = False,
              algorithm: dict[str, Any] | None = None, strategy: str = "none", max_batch: int = 32,
              experiment: dict[str, Any] | None = None, **rollout: Any) -> RLLoop:  # fmt: skip
    """The worker's parts, in process; under torchrun (`strategy = "fsdp2"`) only rank 0 gets the
    engine, the manager and the recorder, as in `rlvr.worker`. `experiment` keys that evaluate
    (eval_steps, eval_at_start) give the manager two held-out prompts."""
    from rlvr.trainer import dist as d

    recipe = Recipe.model_validate({
        "experiment": {"max_steps": steps, "save_steps": 0, "seed": 0, **(experiment or {})},
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"prompts_per_step": 4},
        "domains": {"toy": {"tags": ["toy"], "files": ["x"], "reward": "math_rule"}},
        "rollout": {"n": 4, "max_new_tokens": 12, "temperature": 1.0, "max_staleness": k, **rollout},
        "trainer": {"strategy": strategy, "lr": 3e-3, "micro_batch_size": 4},
        "algorithm": {"preset": "grpo", "kl_in": "none", "kl_coef": 0.0, "tis_cap": 2.0, **(algorithm or {})},
    })  # fmt: skip
    algo = recipe.algorithm
    updates = steps * (algo.ppo_epochs or 1) * (algo.mini_batches or 1)
    cpu = torch.device("cpu")
    actor = Actor.build(recipe.model, recipe.trainer, algo, total_steps=updates, device=cpu, seed=0)
    critic = Critic.build(recipe.model, recipe.trainer, algo, total_steps=updates, device=cpu) if algo.critic else None
    engine = manager = recorder = None
    if d.rank() == 0:
        engine = EmbeddedEngine(model_dir, max_batch=max_batch, device="cpu")
        prompts = [
            Sample(id=f"p{i}", tag="toy", domain="toy", messages=[{"role": "user", "content": f"say {w}"}])
            for i, w in enumerate(["hi", "ok", "yes", "no", "cat", "dog"])
        ]
        held_out = [
            Sample(id=f"e{i}", tag="toy", domain="toy", messages=[{"role": "user", "content": f"say {w}"}])
            for i, w in enumerate(["sun", "sea"])
        ]
        evals = {"toy": held_out} if recipe.experiment.eval_steps or recipe.experiment.eval_at_start else {}
        manager = RolloutManager(recipe, train={"toy": prompts}, evals=evals, tokenizer=engine.tokenizer,
                                 client=engine, rewards=VowelReward(flat))  # type: ignore[arg-type]  # fmt: skip
        recorder = RunRecorder(run_dir, max_steps=steps)
    sync = InProcessSync(actor.model, engine=engine, bucket_mb=16)
    return RLLoop(recipe, run_dir=run_dir, actor=actor, critic=critic, manager=manager, sync=sync,
                  recorder=recorder, pad_id=0)  # fmt: skip


def run(loop: RLLoop, *, resume: str = "none", expect: int = 0) -> list[dict[str, float]]:
    """Resume, push the weights to the engine, run (as `rlvr.worker` does); the metrics rank 0 wrote."""
    import json

    try:
        loop.resume(resume)
        if loop.step and loop.sync is not None:
            loop.sync.push(version=loop.step)  # what the worker does for fresh engines
        assert loop.run() == expect
    finally:
        if loop.manager is not None:
            loop.manager.close()
        if loop.recorder is not None:
            loop.recorder.close("finished")
    path = loop.run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def weights(loop: RLLoop) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in loop.actor.model.state_dict().items()}


def test_ppo_with_critic_gae_and_kl_in_the_reward(tmp_path, model_dir):
    loop = make_loop(
        tmp_path, model_dir, algorithm={"preset": "ppo", "kl_in": "reward", "kl_coef": 0.02, "critic_lr": 1e-3}
    )
    assert loop.recipe.algorithm.kl_in == "reward" and loop.critic is not None
    before = weights(loop)
    metrics = run(loop)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    last = metrics[-1]
    assert "critic/value_loss" in last or any(k.startswith("critic/") for k in last)
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)
    assert any(not torch.equal(before[k], v) for k, v in weights(loop).items())
    assert loop.manager is not None and loop.manager.client.weight_version == "3"  # type: ignore[attr-defined]


def test_eval_at_start_logs_a_step_0_eval_once_and_a_resumed_run_adds_none(tmp_path, model_dir):
    """The base model's point on the eval curve: the keys the periodic eval logs, at step 0, before
    any training; a run resumed from a checkpoint has it already, a fresh rerun logs it once."""
    experiment = {"eval_at_start": True, "eval_steps": 2, "save_steps": 2}
    metrics = run(make_loop(tmp_path, model_dir, steps=2, experiment=experiment))
    assert [m["step"] for m in metrics] == [0, 1, 2]
    eval_keys = {k for k in metrics[0] if k.startswith("eval/")}
    assert eval_keys == {
        "eval/reward/toy/mean",
        "eval/reward/toy/accuracy",
        "eval/toy/toy/mean",
        "eval/toy/toy/accuracy",
    }
    assert set(metrics[0]) == eval_keys | {"step", "time"}  # nothing trained yet
    assert {k for k in metrics[2] if k.startswith("eval/")} == eval_keys  # the periodic eval's keys
    assert "eval/reward/toy/mean" not in metrics[1]

    resumed = run(make_loop(tmp_path, model_dir, steps=3, experiment=experiment), resume="auto")
    assert [m["step"] for m in resumed] == [0, 1, 2, 3]
    assert resumed[0] == metrics[0]

    shutil.rmtree(tmp_path / "checkpoints")  # an attempt that died before its first checkpoint
    again = run(make_loop(tmp_path, model_dir, steps=1, experiment=experiment), resume="auto")
    assert [m["step"] for m in again] == [0, 1]


def test_kl_in_loss_with_adaptive_controller_resumes_its_state(tmp_path, model_dir):
    algorithm = {"kl_in": "loss", "kl_coef": 0.05, "kl_controller": "adaptive", "kl_target": 0.001, "kl_horizon": 10}
    first = make_loop(tmp_path, model_dir, steps=2, algorithm=algorithm)
    first.recipe.experiment.save_steps = 2
    metrics = run(first)
    coef = first.kl.value
    assert coef != 0.05 and metrics[-1]["kl_coef"] == pytest.approx(coef)
    again = make_loop(tmp_path, model_dir, steps=3, algorithm=algorithm)
    again.resume("auto")
    assert again.step == 2 and again.kl.value == pytest.approx(coef)


def test_several_ppo_epochs_and_mini_batches(tmp_path, model_dir):
    loop = make_loop(tmp_path, model_dir, steps=2, algorithm={"ppo_epochs": 2, "mini_batches": 2})
    metrics = run(loop)
    # pi_old was recomputed (not the training forward's): after the first update the ratio moves
    assert all(m["ratio_max"] >= 1.0 for m in metrics) and metrics[-1]["groups/trained"] == 8


def test_a_step_whose_every_group_is_filtered_trains_nothing_and_goes_on(tmp_path, model_dir):
    loop = make_loop(tmp_path, model_dir, steps=2, flat=True, algorithm={"dynamic_sampling": True})
    before = weights(loop)
    metrics = run(loop)
    assert [m.get("train/skipped") for m in metrics] == [1.0, 1.0]
    assert all(torch.equal(before[k], v) for k, v in weights(loop).items())
    assert metrics[-1]["groups/filtered"] == metrics[-1]["groups/started"] == 8


# Runs compared token for token decode one sequence at a time: which requests share a decode
# step follows timing, a batch's size picks the matmul kernel, and a last-bit change in a logit
# can flip a sampled token now and then. One at a time, generation depends on the weights only.
EXACT: dict[str, Any] = {"max_batch": 1}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_after_dynamic_sampling_refills_gives_the_same_weights(tmp_path, model_dir):
    """k = 0: stopped at step 2 and resumed, the run ends bit for bit where a straight run does."""
    algorithm = {"dynamic_sampling": True, "max_refill_rounds": 2}
    straight = make_loop(tmp_path / "a", model_dir, steps=4, algorithm=algorithm, **EXACT)
    run(straight)
    first = make_loop(tmp_path / "b", model_dir, steps=2, algorithm=algorithm, **EXACT)
    first.recipe.experiment.save_steps = 2
    run(first)
    second = make_loop(tmp_path / "b", model_dir, steps=4, algorithm=algorithm, **EXACT)
    metrics = run(second, resume="auto")
    assert metrics[-1]["step"] == 4
    assert same_weights(weights(straight), weights(second))


class BrokenAfter(VowelReward):
    """Judges the first `groups` groups, then cannot judge anything (a judge that went down)."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.left = groups

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        metrics = await super().score_groups(groups)
        for group in groups:
            self.left -= 1
            if self.left < 0:
                group.rewards = [RewardResult(0.0, failed="RuntimeError: reward backend unavailable")] * len(
                    group.completions
                )
        return metrics


def test_rewards_past_their_failure_budget_stop_with_a_checkpoint_and_the_rerun_resumes(tmp_path, model_dir):
    """Step 2's rewards all fail: the run stops before training on them, with step 1 saved and the
    one line that says why; rerun with the reward back, it redoes step 2 and ends bit for bit where a
    straight run does (the failed step's prompts are drawn again)."""
    from rlvr.loop import FAILED_EXIT

    straight = make_loop(tmp_path / "a", model_dir, steps=3, **EXACT)
    run(straight)
    broken = make_loop(tmp_path / "b", model_dir, steps=3, **EXACT)
    broken.manager.rewards = BrokenAfter(groups=4)  # type: ignore[union-attr]  # step 1 has 4 groups
    metrics = run(broken, expect=FAILED_EXIT)
    assert [m["step"] for m in metrics] == [1]  # step 2 was not trained, nor logged as if it were
    assert (
        broken.failure
        == "reward toy could not judge 16 of 32 samples in steps 1-2: RuntimeError: reward backend unavailable"
    )
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("step_*")) == ["step_1"]
    events = (tmp_path / "b" / "events.jsonl").read_text()
    assert "reward toy could not judge 16 of 16 samples in step 2 (not trained on)" in events
    again = make_loop(tmp_path / "b", model_dir, steps=3, **EXACT)
    metrics = run(again, resume="auto")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert same_weights(weights(straight), weights(again))


def test_async_loop_bounds_staleness_and_corrects_off_policy(tmp_path, model_dir):
    loop = make_loop(tmp_path, model_dir, steps=4, k=1, max_new_tokens=48)
    metrics = run(loop)
    assert all(m["rollout/staleness_max"] <= 1 for m in metrics)
    assert any(m["rollout/staleness_max"] == 1 for m in metrics[1:])  # generation overlapped training
    stale_steps = [m for m in metrics[1:] if m["rollout/staleness_max"] == 1]
    assert all("mismatch_kl" in m and "tis_weight_mean" in m for m in stale_steps)
    counts = loop.manager.counts  # type: ignore[union-attr]
    assert counts["started"] == sum(counts[e] for e in GROUP_ENDS) and counts["trained"] == 16


def test_k0_loop_equals_the_sequential_loop(tmp_path, model_dir):
    """k = 0 is the loop rlvr ran before it went asynchronous: generate each step's groups with one
    n-sample request per prompt, score them all, filter and refill, train, push. Same losses, same
    weights, bit for bit."""
    import asyncio

    from rlvr.algorithms.filters import keep_group
    from rlvr.data.mixture import hash_seed
    from rlvr.rollout.base import GenerateRequest
    from rlvr.trainer.step import train_on

    algorithm = {"dynamic_sampling": True, "max_refill_rounds": 1, "min_group_std": 0.02}
    ref = make_loop(tmp_path / "ref", model_dir, steps=3, algorithm=algorithm, **EXACT)
    manager, rec = ref.manager, ref.recipe
    assert manager is not None and ref.sync is not None
    engine, rewards = manager.client, manager.rewards
    losses, dropped = [], 0
    try:
        for step in range(3):
            pending, kept = manager.mixture.next_batch(), []
            for round_ in range(2):
                requests = [
                    GenerateRequest(manager.prompts.prompt_ids(s), manager.episodes.sampling(
                        seed=hash_seed(rec.experiment.seed * 100_003 + step * 16 + round_, f"{s.id}:{i}")), n=4)
                    for i, s in enumerate(pending)
                ]  # fmt: skip
                completions = asyncio.run(engine.generate(requests))
                groups = [Group(sample=s, completions=completions[i * 4 : (i + 1) * 4]) for i, s in enumerate(pending)]
                asyncio.run(rewards.score_groups(groups))
                survivors = [g for g in groups if keep_group(g.scores, cfg=rec.algorithm)]
                dropped += len(groups) - len(survivors)
                kept += survivors
                missing = rec.data.prompts_per_step - len(kept)
                if missing <= 0:
                    break
                lost = [g.sample.domain for g in groups if g not in survivors][:missing]
                pending = [s for d in lost for s in manager.mixture.take(d, 1)]
            rollout = manager.shaping.build_batch(kept[: rec.data.prompts_per_step])
            metrics = train_on(rollout, actor=ref.actor, critic=None, algorithm=rec.algorithm, kl_coef=0.0, pad_id=0)
            losses.append(metrics["loss"])
            ref.sync.push(version=step + 1)
    finally:
        manager.close()
    assert dropped > 0  # the refill path ran
    loop = make_loop(tmp_path / "loop", model_dir, steps=3, algorithm=algorithm, **EXACT)
    metrics = run(loop)
    assert [m["loss"] for m in metrics] == losses
    assert same_weights(weights(ref), weights(loop))


def test_async_loop_takes_pi_old_from_the_training_forward_and_corrects_stale_samples_with_it(
    tmp_path, model_dir, monkeypatch
):
    """k = 1, what the correction is computed from: a step trained on samples of older weights takes
    pi_old from the training forward (the trainer's current weights, no extra forward), which differs
    from the engine's logprobs by the update in between (while on an on-policy step the same weights
    give the engine's logprobs back: only numerics differ), and the loss's importance weight and
    mismatch_kl are that gap."""
    loop = make_loop(tmp_path, model_dir, steps=4, k=1, max_new_tokens=48)
    assert loop.manager is not None
    seen: list[tuple[Any, Any, Any]] = []  # per step: the rollout batch, the train batch, pi_current
    rollouts: list[Any] = []
    take, update_policy = loop.manager.take, step_module.update_policy

    def _take(step: int, **kw: Any) -> Any:
        batch, metrics = take(step, **kw)
        rollouts.append(batch)
        return batch, metrics

    def _update_policy(actor: Any, batch: Any, **kw: Any) -> dict[str, float]:
        with torch.no_grad():
            current = loop.actor.compute_logprobs(batch)[0]  # the trainer's weights now, before the update
        seen.append((rollouts[-1], batch, current))
        return update_policy(actor, batch, **kw)

    loop.manager.take = _take  # type: ignore[method-assign]
    monkeypatch.setattr(step_module, "update_policy", _update_policy)
    metrics = run(loop)

    def gaps(batch: Any, logprobs: torch.Tensor) -> list[float]:
        mask = batch.response_mask.bool()
        return [
            (logprobs[i][mask[i]] - batch.rollout_logprobs[i][mask[i]]).abs().max().item() for i in range(len(mask))
        ]

    stale_steps = 0
    for step, ((rollout, batch, current), m) in enumerate(zip(seen, metrics, strict=True)):
        if min(rollout.versions) >= step:  # on-policy: pi_old is the training forward's own, the engine's numbers
            assert batch.old_logprobs is None and max(gaps(batch, current)) < 1e-4
            assert m["mismatch_kl"] < 1e-6 and m["tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
            continue
        stale_steps += 1
        assert batch.old_logprobs is None  # one update per batch: the training forward's own, not a forward more
        assert min(gap for gap, v in zip(gaps(batch, current), rollout.versions, strict=True) if v < step) > 1e-3
        # The loss's correction is that gap: mismatch_kl = k3(pi_rollout || pi_old), the weight min(ratio, cap).
        mask = batch.response_mask.bool()
        gap = (current - batch.rollout_logprobs)[mask].double()
        assert m["mismatch_kl"] > 1e-4
        assert m["mismatch_kl"] == pytest.approx(
            (torch.expm1(gap) - gap).mean().item(), rel=1e-3
        )  # k3 under pi_rollout
        assert m["tis_weight_mean"] == pytest.approx(gap.exp().clamp(max=2.0).mean().item(), rel=1e-4)
    assert stale_steps >= 2 and min(seen[0][0].versions) >= 0
