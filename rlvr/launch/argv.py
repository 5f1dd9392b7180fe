"""The command lines every launcher runs: torchrun for trainer ranks, a server per rollout slot.

Local runs, submitit jobs and hand-written sbatch scripts all start the same two kinds
of process, so the commands are built here once and golden-tested.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rlvr.recipe.model_folder import longest_sequence
from rlvr.recipe.plan import LaunchPlan, ServerSpec
from rlvr.recipe.schema import Recipe

# Tests swap the trainer for a fake one; production always runs rlvr.worker.
WORKER_MODULE_ENV = "RLVR_WORKER_MODULE"
# Tests swap each rollout server for an HTTP stub (`python -m MODULE --host H --port P`).
SERVER_MODULE_ENV = "RLVR_SERVER_MODULE"


def worker_module() -> str:
    return os.environ.get(WORKER_MODULE_ENV, "rlvr.worker")


def trainer_command(
    plan: LaunchPlan,
    *,
    run_dir: str | Path,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    python: str = sys.executable,
    resume: str = "auto",
) -> list[str]:
    """torchrun for one trainer node (static rendezvous: the first trainer node is master), through
    `rlvr.trainer.torchrun`: a worker's clean stop exits non-zero without torchrun's crash report."""
    return [
        python,
        "-m",
        "rlvr.trainer.torchrun",
        f"--nnodes={len(plan.trainer_nodes)}",
        f"--nproc-per-node={plan.trainer_procs_per_node}",
        f"--node-rank={node_rank}",
        f"--master-addr={master_addr}",
        f"--master-port={plan.master_port}",
        "-m",
        worker_module(),
        "--run-dir",
        str(run_dir),
        "--resume",
        resume,
    ]


def server_command(
    recipe: Recipe,
    spec: ServerSpec,
    *,
    host: str = "127.0.0.1",
    python: str = sys.executable,
    prompt_tokens: int | None = None,
) -> list[str]:
    """The rollout server for one slot: `rlvr serve` (embedded) or SGLang's launcher. `prompt_tokens`:
    the longest prompt measured in the data (`embedded_max_seq_len`), None when not measured."""
    stub = os.environ.get(SERVER_MODULE_ENV)
    if stub:
        return [sys.executable, "-m", stub, "--host", host, "--port", str(spec.port)]
    model_path = recipe.model.path
    if recipe.rollout.engine == "vllm":
        from rlvr.rollout.vllm import build_vllm_command
        from rlvr.rollout.vllm_env import plugin_dir

        if model_path is None:
            raise ValueError("a vLLM rollout server needs model.path (a model folder), not model.config")
        return build_vllm_command(
            recipe,
            model_path=str(model_path),
            host=host,
            port=spec.port,
            on_gpu=bool(spec.gpus),
            plugin_path=str(plugin_dir()),
            max_model_len=vllm_max_model_len(recipe),
        )
    if recipe.rollout.engine == "sglang":
        from rlvr.rollout.sglang import build_sglang_command

        return build_sglang_command(
            recipe.rollout,
            model_path=str(model_path),
            host=host,
            port=spec.port,
            dtype=recipe.model.dtype,
            weight_version="0",  # the base weights; SGLang reports "default" otherwise (a resume pushes its step)
            seed=recipe.experiment.seed,
            tokenizer_path=recipe.model.tokenizer,
        )
    if model_path is None:
        raise ValueError("the embedded rollout server needs model.path (a model folder), not model.config")
    command = [python, "-m", "rlvr.cli", "serve", str(model_path), "--host", host, "--port", str(spec.port)]
    command += ["--max-batch", str(recipe.rollout.max_batch)]
    command += ["--dtype", "float32" if not spec.gpus else recipe.model.dtype]
    # The KV cache holds what a step can make, not the engine's default 2048 tokens a sequence.
    command += ["--max-seq-len", str(embedded_max_seq_len(recipe, prompt_tokens))]
    if recipe.rollout.kv_cache_gb is not None:
        command += ["--kv-cache-gb", str(recipe.rollout.kv_cache_gb)]
    if recipe.rollout.api_key:
        command += ["--api-key", recipe.rollout.api_key]
    return command


def prepare_servers(recipe: Recipe) -> None:
    """What a server command needs on the machine that runs it, beyond the argv: vLLM's servers
    load rlvr's weight-transfer backend from the plug-in folder (`rlvr.rollout.vllm_env`)."""
    if recipe.rollout.engine == "vllm" and not os.environ.get(SERVER_MODULE_ENV):
        from rlvr.rollout.vllm_env import ensure_plugin_dir

        ensure_plugin_dir()


PROMPT_ROUND = 64
"""A measured prompt length is rounded up to a multiple of this for the KV cache (a margin)."""


def embedded_max_seq_len(recipe: Recipe, prompt_tokens: int | None = None) -> int:
    """`rlvr serve --max-seq-len` (its KV cache is `rollout.max_batch` sequences of this many
    tokens): the longest sequence a step can make. Sized from `data.max_prompt_tokens` (default
    1024), or, where launch measured the longest prompt of every training and eval row
    (`DataCheck.longest_prompt`), from that length rounded up to a multiple of PROMPT_ROUND (never
    above the limit): a recipe whose prompts are 60 tokens then gets 64 x (128 + the response),
    not 64 x (1024 + the response). The rollout never sends a longer prompt: it skips rows over
    `data.max_prompt_tokens` and the data was measured as the rollout tokenizes it."""
    limit = recipe.data.max_prompt_tokens
    if prompt_tokens is None or prompt_tokens >= limit:
        return longest_sequence(recipe)
    rounded = min(limit, -(-max(prompt_tokens, 1) // PROMPT_ROUND) * PROMPT_ROUND)
    measured = recipe.model_copy(update={"data": recipe.data.model_copy(update={"max_prompt_tokens": rounded})})
    return longest_sequence(measured)


def vllm_max_model_len(recipe: Recipe) -> int:
    """`rollout.vllm.max_model_len`, else the longest sequence a step can make (prompt limit plus
    the longest response or tool episode), capped at the model's `max_position_embeddings`
    (vLLM refuses a longer context; each sequence's KV cache is sized by it). The embedded
    server's `--max-seq-len` is the same number (its KV cache is sized by it too)."""
    if recipe.rollout.vllm.max_model_len:
        return recipe.rollout.vllm.max_model_len
    return longest_sequence(recipe)


def judge_command(recipe: Recipe, *, host: str, port: int, python: str = sys.executable) -> list[str]:
    """`rlvr serve` for the recipe's `[judge]` model (the OpenAI route is what llm_judge calls)."""
    assert recipe.judge is not None
    command = [python, "-m", "rlvr.cli", "serve", recipe.judge.model, "--host", host, "--port", str(port)]
    return command + ["--max-batch", str(recipe.judge.max_batch), "--dtype", "float32"]
