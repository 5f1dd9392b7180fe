"""torchrun entry of a trainer rank: `python -m rlvr.worker --run-dir RUN [--resume auto|none|PATH]`.

Reads the resolved recipe the launcher wrote into the run directory, joins the process
group, builds the actor (and critic), and on rank 0 the rollout manager (data, rollout
client, rewards) and the recorder; then runs the loop. Reads like the list of parts.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, cast

from rlvr.rundir import RunDir, StaleGeneration, trainer_generation

log = logging.getLogger("rlvr.worker")


def main(argv: list[str] | None = None) -> int:
    from rlvr.process import Heartbeat, heartbeat_interval, raise_open_files_limit, stay_with_parent

    # A worker whose torchrun agent dies goes with it: orphaned, it would train on and write the
    # run beside the trainer the launcher starts next. torchrun runs each worker in a session of
    # its own, so only the parent-death signal reaches it.
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None and not stay_with_parent(signal.SIGKILL):
        print("rlvr.worker: its torchrun agent is gone before it started; exiting", file=sys.stderr, flush=True)
        return 1
    raise_open_files_limit()  # rank 0 holds a socket per in-flight request, a pipe per sandbox
    parser = argparse.ArgumentParser(prog="rlvr.worker")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--resume", default="auto", help="auto (latest checkpoint), none, or a checkpoint path")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # logs/trainer.log: what was loaded (below), weight-sync groups, servers lost and back
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import torch

    from rlvr.loop import FAILED_EXIT, RLLoop
    from rlvr.recipe.load import recipe_from_json
    from rlvr.recipe.plan import TRAINER_RESTART_ENV, make_plan
    from rlvr.rendezvous import wait_for_judge, wait_for_servers
    from rlvr.rollout.factory import sync_pause_mode
    from rlvr.server.commands import quiet_loading_bars
    from rlvr.sync import make_weight_sync
    from rlvr.trainer import dist as d
    from rlvr.trainer.actor import Actor
    from rlvr.trainer.model import load_tokenizer

    quiet_loading_bars()  # transformers' "Loading weights" bar in trainer.log says nothing
    generation = trainer_generation()  # this start's; a newer one fences it (docs/running.md)
    try:
        RunDir(args.run_dir).check_generation(generation, doing="the start")
    except StaleGeneration as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return FAILED_EXIT
    recipe = recipe_from_json(RunDir(args.run_dir).recipe.read_text())
    exp, algo = recipe.experiment, recipe.algorithm
    torch.manual_seed(exp.seed)
    info = d.init_distributed(force=recipe.trainer.strategy == "fsdp2")
    updates = exp.max_steps * algo.ppo_epochs * algo.mini_batches
    actor = Actor.build(
        recipe.model, recipe.trainer, algo,
        total_steps=updates, device=info.device, seed=exp.seed,
        temperature=recipe.rollout.temperature or 1.0, max_response_len=recipe.rollout.max_new_tokens,
    )  # fmt: skip
    critic = build_critic(recipe, total_steps=updates, device=info.device) if algo.critic else None
    tokenizer = load_tokenizer(recipe.model)
    if tokenizer is None:
        raise SystemExit("model.path (or model.tokenizer) must name a folder with a tokenizer to run the loop")
    if info.is_main:
        for line in startup_lines(recipe, actor, tokenizer, on_gpu=info.device.type == "cuda"):
            log.info("%s", line)

    planned = len(make_plan(recipe).servers)
    servers = wait_for_servers(args.run_dir, count=planned, timeout_s=recipe.rollout.timeout_s)
    manager = recorder = None
    if info.is_main and recipe.judge is not None:  # a judge the launcher serves (recipe [judge])
        os.environ["RLVR_JUDGE_URL"] = wait_for_judge(args.run_dir, timeout_s=recipe.rollout.timeout_s)
    if info.is_main:
        manager = build_manager(
            recipe, tokenizer=tokenizer, urls=[s.url for s in servers], run_dir=args.run_dir, generation=generation
        )
        recorder = build_recorder(recipe, run_dir=args.run_dir)
        problem = judges_problem(recipe)
        if problem is not None:  # before step 1, not as a step of failed verdicts
            manager.close()
            recorder.event(problem, level="error")
            recorder.close("failed", error=problem)
            print(f"error: {problem}", file=sys.stderr, flush=True)
            return FAILED_EXIT  # a stop it reported itself: torchrun's wrapper keeps it quiet
    client = manager.client if manager is not None else None
    sync = make_weight_sync(
        recipe.sync, model=actor.model, client=client, run_dir=args.run_dir, tokenizer=tokenizer,
        pause_mode=sync_pause_mode(recipe.rollout),
    )  # fmt: skip

    loop = RLLoop(
        recipe, run_dir=args.run_dir, actor=actor, critic=critic, manager=manager, sync=sync,
        recorder=recorder, pad_id=cast("int | None", tokenizer.pad_token_id) or 0,  # typed as any id form
        generation=generation,
    )  # fmt: skip
    restarted = int(os.environ.get(TRAINER_RESTART_ENV, "0") or 0) > 0
    state, error = "failed", None
    # From here a rank stopped whole (SIGSTOP, a frozen node) is told from a slow one by its
    # launcher: this thread goes silent with it, never with a long step (rlvr/launch/health.py).
    interval = heartbeat_interval(recipe.rollout.health_deadline_s)
    heartbeat = Heartbeat(RunDir(args.run_dir).heartbeat(info.rank), interval_s=interval).start()
    try:
        if (loop.resume(args.resume) or restarted) and sync is not None:
            # fresh servers hold the base weights, and those a dead trainer left running its last push
            sync.push(version=loop.step)
        code = loop.run()
        state = "finished" if code == 0 else "stopped"
        if loop.failure is not None:  # a failure the loop stopped for, checkpointed: the line says why
            state, error = "failed", loop.failure
            print(f"error: {loop.failure}", file=sys.stderr, flush=True)
        if torch.distributed.is_initialized():
            # Leave together: a rank that destroys its gloo group while a peer still uses it
            # makes the peer abort ("terminate called without an active exception").
            torch.distributed.barrier()
        return code
    except StaleGeneration as exc:  # a newer trainer owns the run and the engines: write nothing more
        print(f"error: {exc}", file=sys.stderr, flush=True)
        recorder = None  # status.json is the newer trainer's
        return FAILED_EXIT
    finally:
        if sync is not None:
            sync.close()
        if manager is not None:
            manager.close()
        if recorder is not None:
            recorder.close(state, error=error)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        heartbeat.stop()  # its last word: ending, not hung


def startup_lines(recipe, actor, tokenizer, *, on_gpu: bool) -> list[str]:
    """What the trainer loaded, for logs/trainer.log: the model (folder, architecture, the dtype its
    weights really have, parameters, tied head, vocabulary), the reference model, and the token ids
    that end a response (what the rollout servers stop on: the tokenizer's, config's and
    generation config's eos, and `rollout.stop_token_ids`)."""
    model, cfg = actor.model, recipe.model
    config = getattr(model, "config", None)
    arch = (getattr(config, "architectures", None) or [type(model).__name__.removeprefix("FSDP")])[0]
    params = list(model.parameters())
    dtype = str(params[0].dtype).removeprefix("torch.") if params else "?"
    if on_gpu and recipe.trainer.strategy == "fsdp2":
        dtype += f", computed in {recipe.trainer.param_dtype} (trainer.param_dtype)"
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    inputs = _call(model, "get_input_embeddings")
    outputs = _call(model, "get_output_embeddings")
    if inputs is not None and outputs is not None:
        tied = "yes" if getattr(outputs, "weight", None) is getattr(inputs, "weight", 0) else "no"
    else:
        tied = "yes" if getattr(config, "tie_word_embeddings", False) else "no (or unknown)"
    vocab = getattr(config, "vocab_size", None)
    source = cfg.path or "model.config (built, not loaded)"
    lines = [
        f"model: {source} · {arch} · weights {dtype} (model.dtype = {cfg.dtype}) · {total / 1e6:.1f}M parameters"
        + (f" ({trainable / 1e6:.2f}M trainable)" if trainable != total else "")
        + f" · tied head: {tied} · vocab {vocab} (tokenizer {len(tokenizer)})",
    ]
    if actor.reference is not None:
        lines.append(f"reference model: loaded (a frozen copy of {source}, algorithm.kl_in = {recipe.algorithm.kl_in})")
    elif recipe.algorithm.needs_reference:
        lines.append("reference model: the policy with its LoRA adapters off (not a second copy)")
    else:
        lines.append(f"reference model: none (algorithm.kl_in = {recipe.algorithm.kl_in!r})")
    stops: dict[str, Any] = {
        "tokenizer eos": _token(tokenizer, getattr(tokenizer, "eos_token_id", None)),
        "config eos": getattr(config, "eos_token_id", None),
        "generation_config eos": getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        "pad": _token(tokenizer, getattr(tokenizer, "pad_token_id", None)),
        "rollout.stop_token_ids": list(recipe.rollout.stop_token_ids),
        "rollout.stop": list(recipe.rollout.stop),
    }
    lines.append("stop: " + " · ".join(f"{k} {v}" for k, v in stops.items() if v not in (None, [])))
    return lines


def _call(model, name: str):
    method = getattr(model, name, None)
    try:
        return method() if callable(method) else None
    except (NotImplementedError, AttributeError):
        return None


def _token(tokenizer, token_id) -> str | None:
    """`2 '<|im_end|>'`."""
    if token_id is None:
        return None
    return f"{token_id} {tokenizer.convert_ids_to_tokens(token_id)!r}"


def judges_problem(recipe) -> str | None:
    """None when every judge the recipe's llm_judge domains call answers, else one line naming it."""
    import asyncio

    from rlvr.rewards.llm_judge import check_judge, judge_urls

    urls = judge_urls({name: (d.reward, d.reward_args) for name, d in recipe.domains.items()})
    for url, domains in urls.items():
        args = recipe.domains[domains[0]].reward_args
        key = os.environ.get(args["api_key_env"]) if args.get("api_key_env") else None
        problem = asyncio.run(check_judge(url, api_key=key))
        if problem is not None:
            where = ", ".join(f"domains.{d}" for d in domains)
            return f"judge {url} ({where}) does not answer before step 1: {problem}"
    return None


def build_manager(recipe, *, tokenizer, urls, run_dir, generation: int | None = None):
    from functools import partial

    from rlvr.collect.manager import RolloutManager
    from rlvr.data.sources import load_recipe_domains
    from rlvr.rendezvous import server_instances
    from rlvr.rewards.pool import RewardPool
    from rlvr.rewards.workers import reward_workers
    from rlvr.rollout.factory import make_client

    train, _ = load_recipe_domains(recipe)
    evals, _ = load_recipe_domains(recipe, eval_files=True)
    rejoin = recipe.sync.on_engine_failure == "continue"
    client = make_client(
        recipe.rollout, urls, rejoin=rejoin, instances=partial(server_instances, run_dir), generation=generation
    )
    # Sized from this process's cores, the trainer ranks beside it (torchrun's LOCAL_WORLD_SIZE) and
    # whether any domain's reward uses the pool at all: `reward_workers` says why.
    workers = reward_workers(
        [d.reward for d in recipe.domains.values()], trainer_ranks_on_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    )
    rewards = RewardPool.from_domains(
        {name: (d.reward, d.reward_args) for name, d in recipe.domains.items()},
        max_workers=workers or None,
        call_timeout_s=recipe.rewards.call_timeout_s,
    )
    return RolloutManager(recipe, train=train, evals=evals, tokenizer=tokenizer, client=client, rewards=rewards)


def build_recorder(recipe, *, run_dir: Path):
    from rlvr.monitor.metrics import RunRecorder
    from rlvr.monitor.sinks import make_sinks

    sinks = make_sinks(
        recipe.monitor, run_dir=run_dir, name=recipe.experiment.name, config=recipe.model_dump(mode="json")
    )
    return RunRecorder(run_dir, max_steps=recipe.experiment.max_steps, name=recipe.experiment.name, sinks=sinks)


def build_critic(recipe, *, total_steps: int, device):
    from rlvr.trainer.critic import Critic

    return Critic.build(
        recipe.model, recipe.trainer, recipe.algorithm,
        total_steps=total_steps, device=device, seed=recipe.experiment.seed, max_response_len=recipe.rollout.max_new_tokens,
    )  # fmt: skip


if __name__ == "__main__":
    code = main()
    from rlvr.trainer.dist import exit_process

    exit_process(code)  # skips an exit-time teardown that can abort a finished rank
