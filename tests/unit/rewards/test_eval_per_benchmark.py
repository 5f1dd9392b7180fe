"""Eval per benchmark: `rlvr validate` reads eval files, eval rows keep their tags, mean@k / pass@k."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.evaluation import eval_metrics, evaluate_groups
from rlvr.rewards.pool import RewardPool
from rlvr.types import Group, RewardResult, Sample
from tests.unit.recipe.helpers import MINIMAL, write_recipe

from .conftest import make_completion

runner = CliRunner()
# ROLL's data/math_benchmarks.jsonl shape: one file, a tag per benchmark, none of them the domain's.
BENCH_ROWS = [
    '{"id": "a1", "tag": "aime2024", "prompt": "1+1?", "ground_truth": "2"}',
    '{"id": "a2", "tag": "aime2025", "prompt": "2+2?", "ground_truth": "4"}',
    '{"id": "m1", "tag": "MATH-500", "prompt": "3+3?", "ground_truth": "6"}',
]
WITH_EVAL = MINIMAL.replace(
    'files = ["{math}"]', 'files = ["{math}"]\neval_files = ["bench.jsonl"]\neval_n = 4\neval_temperature = 0.6'
)


def test_validate_reads_eval_files_and_accepts_benchmark_tags(tmp_path: Path) -> None:
    (tmp_path / "bench.jsonl").write_text("\n".join(BENCH_ROWS) + "\n")
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path, WITH_EVAL))])
    assert result.exit_code == 0, result.output
    (tmp_path / "bench.jsonl").write_text(BENCH_ROWS[0] + '\n{"id": "a9", "tag": "aime2024", "prompt": "no gold"}\n')
    bad = runner.invoke(app, ["validate", str(write_recipe(tmp_path, WITH_EVAL))])
    assert bad.exit_code == 2
    assert "bench.jsonl:2: math_rule rows need 'ground_truth'" in " ".join(bad.stderr.split())


def test_eval_rows_keep_their_tags_and_their_domain(tmp_path: Path) -> None:
    from rlvr.data.sources import load_recipe_domains
    from rlvr.recipe.load import load_recipe

    (tmp_path / "bench.jsonl").write_text("\n".join(BENCH_ROWS) + "\n")
    recipe = load_recipe(write_recipe(tmp_path, WITH_EVAL), [])
    evals, _ = load_recipe_domains(recipe, eval_files=True)
    assert [(s.domain, s.tag) for s in evals["math"]] == [
        ("math", "aime2024"),
        ("math", "aime2025"),
        ("math", "MATH-500"),
    ]
    assert (recipe.domains["math"].eval_n, recipe.domains["math"].eval_temperature) == (4, 0.6)


def group(tag: str, scores: list[float]) -> Group:
    g = Group(sample=Sample(tag, tag, [], domain="math"), completions=[make_completion("") for _ in scores])
    g.rewards = [RewardResult(s, {}) for s in scores]
    return g


def test_metrics_per_benchmark_with_mean_at_k_and_pass_at_k():
    metrics = eval_metrics(
        [group("aime2024", [1.0, 0.0, 0.0, 0.0]), group("aime2024", [0.0] * 4), group("MATH-500", [1.0] * 4)]
    )
    assert metrics["eval/math/aime2024/mean"] == 0.125
    assert metrics["eval/math/aime2024/accuracy"] == 0.125
    assert metrics["eval/math/aime2024/pass@4"] == 0.5
    assert metrics["eval/math/MATH-500/pass@4"] == 1.0
    assert metrics["eval/reward/math/mean"] == 5 / 12  # the domain line the dashboard and old runs read


async def test_evaluate_groups_uses_each_domains_n_and_temperature_and_its_reward():
    calls = []

    async def generate(samples, n, temperature):
        calls.append((len(samples), n, temperature))
        return [Group(sample=s, completions=[make_completion(f"\\boxed{{{s.ground_truth}}}")] * n) for s in samples]

    samples = [
        Sample("a", "aime2024", [], domain="math", ground_truth="2"),
        Sample("b", "MATH-500", [], domain="math", ground_truth="4"),
    ]
    pool = RewardPool.from_domains({"math": ("math_rule", {})})
    try:
        metrics = await evaluate_groups({"math": samples}, generate=generate, rewards=pool, settings={"math": (3, 0.7)})
    finally:
        pool.close()
    assert calls == [(2, 3, 0.7)]
    assert metrics["eval/math/aime2024/accuracy"] == 1.0 and metrics["eval/math/MATH-500/pass@3"] == 1.0


def test_samples_the_reward_could_not_judge_are_counted_not_averaged():
    g = group("gsm8k", [1.0, 1.0, 0.0])
    g.rewards[1] = RewardResult(0.0, {}, failed="judge http://j gave no answer within 30 s")
    metrics = eval_metrics([g, group("gsm8k", [1.0, 1.0, 1.0])])
    assert metrics["eval/math/gsm8k/mean"] == 0.8 and metrics["eval/reward/math/mean"] == 0.8  # 4 of 5 judged
    assert metrics["eval/math/gsm8k/failed"] == 1.0
    assert metrics["eval/math/gsm8k/pass@3"] == 1.0
