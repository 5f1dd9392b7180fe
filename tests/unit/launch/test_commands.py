"""The command lines every launcher runs, pinned for the flagship recipe."""

from __future__ import annotations

from pathlib import Path

from rlvr.launch.argv import judge_command, server_command, trainer_command
from rlvr.recipe.load import load_recipe
from rlvr.recipe.plan import make_plan

ROOT = Path(__file__).resolve().parents[3]


def test_sglang_server_command_for_the_flagship() -> None:
    recipe = load_recipe(ROOT / "recipes" / "math_code_judge.toml", ["rollout.sglang.tp_size=2"])
    plan = make_plan(recipe)
    assert [s.gpus for s in plan.servers] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    argv = server_command(recipe, plan.servers[1], host="10.0.0.2")
    assert argv == [
        "/opt/sglang-env/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/Qwen2.5-7B-Instruct",
        "--host", "10.0.0.2", "--port", "30001", "--tp-size", "2", "--dp-size", "1", "--mem-fraction-static", "0.8",
        "--dtype", "bfloat16", "--weight-version", "0", "--random-seed", "42",
    ]  # fmt: skip


def test_trainer_command_is_torchrun_with_static_rendezvous() -> None:
    recipe = load_recipe(ROOT / "recipes" / "math_code_judge.toml", ["cluster.nodes=4", "cluster.trainer_nodes=2"])
    plan = make_plan(recipe, master_port=29555)
    argv = trainer_command(plan, run_dir="/shared/runs/x", node_rank=1, master_addr="10.0.0.1", python="python")
    assert argv == [
        "python", "-m", "rlvr.trainer.torchrun", "--nnodes=2", "--nproc-per-node=8", "--node-rank=1",
        "--master-addr=10.0.0.1", "--master-port=29555", "-m", "rlvr.worker", "--run-dir", "/shared/runs/x",
        "--resume", "auto",
    ]  # fmt: skip


def test_local_quickstart_runs_embedded_servers_and_the_judge() -> None:
    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml")
    plan = make_plan(recipe)
    assert plan.kind == "local" and plan.trainer_world_size == 1 and len(plan.servers) == 1
    argv = server_command(recipe, plan.servers[0], python="python")
    assert argv[:4] == ["python", "-m", "rlvr.cli", "serve"] and argv[4].endswith("recipes/quickstart/policy")
    # --max-seq-len: the KV cache holds data.max_prompt_tokens + rollout.max_new_tokens = 64 + 64 tokens
    # a sequence (the model's 512 positions allow it), not the engine's default 2048.
    expected = ["--host", "127.0.0.1", "--port", "30000", "--max-batch", "128", "--dtype", "float32"]
    assert argv[5:] == [*expected, "--max-seq-len", "128"]
    judge = judge_command(recipe, host="127.0.0.1", port=31000, python="python")
    assert judge[4].endswith("recipes/quickstart/judge") and "--port" in judge


def test_the_embedded_kv_cache_is_sized_from_the_measured_prompts() -> None:
    """launch measures every row's prompt (rlvr.data.prompt_fit): with the default prompt limit of
    1024 and prompts of 60 tokens, a server's sequences are 64 + the response, not 1024 + it."""
    from rlvr.launch.argv import embedded_max_seq_len

    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", ["data.max_prompt_tokens=1024", "model.path=/nowhere"])
    assert embedded_max_seq_len(recipe) == 1024 + 64  # not measured: the limit
    assert embedded_max_seq_len(recipe, 60) == 64 + 64  # rounded up to a multiple of 64
    assert embedded_max_seq_len(recipe, 65) == 128 + 64
    assert embedded_max_seq_len(recipe, 2000) == 1024 + 64  # longer rows are skipped: never above the limit
    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", ["data.max_prompt_tokens=100", "model.path=/nowhere"])
    assert embedded_max_seq_len(recipe, 90) == 100 + 64  # the rounding stops at the limit too
    plan = make_plan(recipe)
    argv = server_command(recipe, plan.servers[0], python="python", prompt_tokens=30)
    assert argv[argv.index("--max-seq-len") + 1] == str(64 + 64)


def test_the_prompt_measure_is_none_unless_every_row_was_counted() -> None:
    from rlvr.data.prompt_fit import DataCheck, PromptFit

    counted = DataCheck(
        fits={"a": PromptFit(rows=3, counted=3, longest=40)}, eval_fits={"a": PromptFit(2, 2, longest=57)}
    )
    assert counted.longest_prompt == 57
    sampled = DataCheck(fits={"a": PromptFit(rows=30_000, counted=20_000, longest=40)})
    assert sampled.longest_prompt is None  # a sample's longest is not every row's
    assert DataCheck(not_counted="no tokenizer").longest_prompt is None
