"""End to end: the quickstart trained by rlvr and by TRL's GRPOTrainer, wall clock and rewards, in one run.

    python bench/e2e.py                  # 20 steps each (a few minutes on 2 CPU cores)
    python bench/e2e.py --steps 10       # shorter, for a loaded machine
    python bench/e2e.py --only rlvr rlvr-async1   # any of rlvr, rlvr-async1, rlvr-async2, trl
    python bench/e2e.py --repeats 2      # each system twice, alternating; wall = best run

Each system runs as its own child process and is timed from the parent, start-up included
(imports, model load, the judge server coming up), until it exits:

- rlvr, three ways: synchronous (`rollout.max_staleness = 0`) and asynchronous (1 and 2, with
  `algorithm.tis_cap = 2` unless the recipe sets one): `python -m rlvr.cli launch
  recipes/quickstart.toml --no-dashboard` with max_steps = N and no eval/checkpoints; it starts its judge server, one embedded rollout server and one
  torchrun trainer rank. Rewards come from the run's metrics.jsonl (`reward/mean`).
- TRL: a judge server (`python -m rlvr.cli serve <recipe judge> --port <free>`) plus one
  process running `trl.GRPOTrainer` for N steps. Rewards come from the trainer's log
  (`reward`, the mean over all completions of the step: the same quantity as rlvr's).

What is the same: the policy folder (fp32, CPU), the prompts (the recipe's train files, fed
in exactly the order rlvr's MixtureSampler draws them with the recipe's seed and domain
mix, rendered with the tokenizer's chat template + generation prompt), 16 prompts x 8
completions per optimizer step, max 64 new tokens, temperature 1 (no top-p/top-k), the lr
(constant, no warmup, no weight decay, AdamW betas, grad clip from the recipe), the loss
(GRPO: group mean/std advantages, clip 0.2, per-sequence token mean, one update per batch,
no KL and so no reference model), and the rewards: rlvr's own `RewardPool` over the
registry rewards with the recipe's reward_args (math_rule, code_sandbox, llm_judge talking
to the same tiny judge model), so a completion gets the same score in both.

What is not the same, by design of each system: TRL generates in the trainer process with
HF `generate` (padded batch, the whole batch runs until every sequence stops) and then
recomputes log-probs with a forward pass; rlvr generates in a separate embedded server
(continuous batching, finished sequences leave), ships weights to it after every step, and
trains on packed micro-batches (TRL: padded micro-batches of trainer.micro_batch_size with
gradient accumulation). The two draw from different random streams, so they see different
completions and their reward curves differ by sampling noise; with 20 steps, read "final reward"
as "did it learn", not as a ranking. The CPU is shared, so the wall-clock ratio is the
number to compare across machines, not the seconds.

Prints one table: system, wall seconds, median step seconds, first reward (mean of the
first 3 steps), final reward (mean of the last 3), reward errors + timeouts, and TRL time /
rlvr time (wall and median step). The step time is each system's own timer: rlvr's
`time/step` (rollout, rewards, update, weight sync) and TRL's `step_time` (generation and
rewards inside the first of its gradient-accumulation micro-steps, then all of them; not
the optimizer step, which is tiny here); a median shrugs off the spikes a busy shared CPU
adds to single steps, which wall clock does not. TRL and synchronous rlvr are seeded with the
recipe's seed and on the same CPU give the same rewards run after run: only the times vary
(asynchronous rlvr's samples depend on timing: which weights a sample started under). Exits 0 with a
message when TRL is not installed (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr.process import Children, free_port, log_tail  # noqa: E402 (after the path fix-up)

GROUP = 3  # steps averaged for the "first" and "final" reward
# system -> rollout.max_staleness (None: TRL)
SYSTEMS: dict[str, int | None] = {"rlvr": 0, "rlvr-async1": 1, "rlvr-async2": 2, "trl": None}


# -- helpers ---------------------------------------------------------------------------------
def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def first_last(rewards: list[float]) -> tuple[float, float]:
    return mean(rewards[:GROUP]), mean(rewards[-GROUP:])


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def summarize(rows: list[dict], reward_key: str, step_key: str, seconds: float) -> dict:
    """Per-step rewards and step times, plus the reward errors/timeouts (summed over the run)."""
    bad = sum(value for row in rows for key, value in row.items()
              if key.startswith("reward/") and key.endswith(("/errors", "/timeouts")))  # fmt: skip
    steps = [float(row[step_key]) for row in rows if step_key in row]
    return {"seconds": seconds, "rewards": [float(row[reward_key]) for row in rows], "steps": steps, "bad": bad}


# -- rlvr ------------------------------------------------------------------------------------
def run_rlvr(recipe_path: str, steps: int, out: Path, *, staleness: int = 0) -> dict:
    """rlvr with `rollout.max_staleness = staleness` (0: synchronous; asynchronous runs get tis_cap 2)."""
    from rlvr.recipe.load import load_recipe

    recipe = load_recipe(ROOT / recipe_path)
    log = out / "rlvr.log"
    mode = ["--set", f"rollout.max_staleness={staleness}"]
    if staleness and not recipe.algorithm.tis_cap:
        mode += ["--set", "algorithm.tis_cap=2.0"]
    command = [sys.executable, "-m", "rlvr.cli", "launch", recipe_path, "--no-dashboard",
               "--set", f"experiment.output_dir={out / 'rlvr'}", "--set", f"experiment.max_steps={steps}",
               "--set", "experiment.eval_steps=0", "--set", "experiment.save_steps=0", *mode]  # fmt: skip
    name = recipe.experiment.name
    start = time.perf_counter()
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
    return summarize([by_step[s] for s in sorted(by_step)], "reward/mean", "time/step", seconds)


# -- TRL -------------------------------------------------------------------------------------
def run_trl(recipe_path: str, steps: int, out: Path) -> dict:
    """Judge server + the GRPOTrainer process (this file with --trl-worker), timed together."""
    from rlvr.launch.commands import judge_command
    from rlvr.recipe.load import load_recipe

    recipe = load_recipe(ROOT / recipe_path)
    start = time.perf_counter()
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
    return summarize([by_step[s] for s in sorted(by_step)], "reward", "step_time", seconds)


def trl_worker(recipe_path: str, steps: int, out: Path, judge_url: str) -> None:
    """The TRL side, in its own process: same prompts, rewards and hyper-parameters as the recipe."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.data.mixture import MixtureSampler
    from rlvr.data.sources import load_recipe_domains
    from rlvr.rewards.pool import RewardPool
    from rlvr.types import Completion, Group

    recipe = load_recipe_abs(recipe_path)
    algo, trainer, rollout = recipe.algorithm, recipe.trainer, recipe.rollout
    if algo.kl_in != "none" or algo.loss_agg != "seq-mean-token-mean" or algo.adv_std_norm != "group":
        raise SystemExit("this bench maps only the quickstart's GRPO settings (no KL, seq-mean-token-mean, group std)")

    # The exact prompt sequence rlvr's controller draws: same sampler, seed and domain mix.
    train, _ = load_recipe_domains(recipe)
    mixture = MixtureSampler(train, probs=recipe.data.domain_interleave_probs,
                             prompts_per_step=recipe.data.prompts_per_step, seed=recipe.experiment.seed,
                             shuffle=recipe.data.shuffle)  # fmt: skip
    samples = [sample for _ in range(steps) for sample in mixture.next_batch()]
    # Conversational prompts: TRL renders them with the tokenizer's chat template and
    # add_generation_prompt=True, which is what rlvr's chat_template = "auto" does.
    assert recipe.model.chat_template == "auto"
    dataset = Dataset.from_dict({"prompt": [s.messages for s in samples], "sample_index": list(range(len(samples)))})

    pool = RewardPool.from_domains(
        {name: (d.reward, reward_args(d, judge_url)) for name, d in recipe.domains.items()},
        max_workers=max(1, (os.cpu_count() or 2) // 2),  # as rlvr's controller sizes it
    )

    def make_reward(domain: str):
        async def reward(prompts, completions, completion_ids, sample_index, log_metric=None, **_):
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

    prompts_per_step = recipe.data.prompts_per_step
    micro = min(trainer.micro_batch_size, prompts_per_step * rollout.n)
    accum = prompts_per_step * rollout.n // micro
    assert micro * accum == prompts_per_step * rollout.n, "micro batch must divide the step's completions"
    config = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        fp16=False,
        model_init_kwargs={"dtype": recipe.model.dtype},
        gradient_checkpointing=recipe.model.gradient_checkpointing,
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
        learning_rate=trainer.lr,
        lr_scheduler_type={"constant": "constant", "linear": "linear", "cosine": "cosine"}[trainer.lr_schedule],
        warmup_steps=trainer.warmup_steps,
        weight_decay=trainer.weight_decay,
        adam_beta1=trainer.betas[0],
        adam_beta2=trainer.betas[1],
        max_grad_norm=trainer.grad_clip,
        beta=0.0,
        num_iterations=algo.ppo_epochs,
        epsilon=algo.clip_ratio_low,
        epsilon_high=algo.clip_ratio_high,
        loss_type="grpo",  # per-sequence mean of per-token losses = rlvr's seq-mean-token-mean
        scale_rewards="group",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(recipe.model.path))
    grpo = GRPOTrainer(
        model=str(recipe.model.path),
        reward_funcs=[make_reward(name) for name in recipe.domains],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    grpo.train()
    pool.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "log_history.json").write_text(json.dumps(grpo.state.log_history, indent=1))


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


# -- main ------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps for each system (at least 1)")
    parser.add_argument("--recipe", default="recipes/quickstart.toml", help="relative to the repository root")
    parser.add_argument("--only", nargs="+", choices=SYSTEMS, help="run only these systems")
    parser.add_argument("--repeats", type=int, default=1, help="runs per system, alternating; wall = best")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (logs, metrics)")
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--judge-url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be at least 1")

    if args.trl_worker:
        trl_worker(args.recipe, args.steps, Path(args.out), args.judge_url)
        return

    systems = args.only or list(SYSTEMS)
    labels = {"rlvr": "rlvr sync (k=0)", "rlvr-async1": "rlvr async (k=1)", "rlvr-async2": "rlvr async (k=2)"}
    if "trl" in systems:
        try:
            import trl
        except ImportError:
            print("bench/e2e.py: TRL is not installed, so there is nothing to compare against.\n"
                  "Install it with: pip install -e '.[bench]'   (trl==1.16.0; keeps torch==2.13.0, transformers==5.24.0)")  # fmt: skip
            return
        labels["trl"] = f"TRL {trl.__version__} GRPOTrainer"

    from rlvr.recipe.load import load_recipe

    recipe = load_recipe(ROOT / args.recipe)
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
                    result = run_rlvr(args.recipe, args.steps, where, staleness=SYSTEMS[system])
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
          f"completions per step, CPU fp32 ({os.cpu_count()} cores)"
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


if __name__ == "__main__":
    main()
