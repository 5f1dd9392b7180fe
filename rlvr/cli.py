"""`rlvr` command line: every subcommand parses first and imports heavy code only when it runs.

Errors a user can fix (bad recipe, bad data, bad flag) print one line to stderr and exit
with code 2; nothing a user types should produce a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="rlvr",
    help="Multi-task RL with verifiable rewards on LLMs, from one TOML recipe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

RecipeArg = Annotated[Path, typer.Argument(help="Recipe TOML file.", show_default=False)]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="Override a key: --set rollout.n=16 (repeatable).")
]


def fail(message: str) -> typer.Exit:
    """Print one red line to stderr; the caller raises the returned Exit(2)."""
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {message}", markup=True)
    return typer.Exit(code=2)


def load_or_exit(path: Path, overrides: list[str] | None, *, check_data: bool = True):
    """The validated recipe, with every data file parsed, or one error line and exit 2."""
    from rlvr.recipe.load import RecipeError, load_recipe

    try:
        recipe = load_recipe(path, overrides or [])
    except RecipeError as exc:
        raise fail(str(exc)) from None
    problem = check_rewards(recipe)
    if problem:
        from rlvr.recipe.load import find_line

        key, _, _ = problem.partition(": ")
        line = find_line(path.read_text(), tuple(key.split(".")))
        raise fail(f"{path}:{line}: {problem}" if line else f"{path}: {problem}")
    if check_data:
        from rlvr.data.sources import DataError, load_recipe_domains

        try:
            load_recipe_domains(recipe)
            load_recipe_domains(recipe, eval_files=True)  # a run reads these too: a bad row must fail here
        except DataError as exc:
            raise fail(str(exc)) from None
    return recipe


def check_rewards(recipe) -> str | None:
    """Every domain's reward must be registered (or an importable plug-in) and take its reward_args."""
    from rlvr.rewards.registry import check_reward_args, check_reward_name

    for name, domain in recipe.domains.items():
        problem = check_reward_name(domain.reward)
        if problem:
            return f"domains.{name}.reward: {problem}"
        problem = check_reward_args(domain.reward, domain.reward_args)
        if problem:
            return f"domains.{name}.reward_args: {problem}"
    return check_tools(recipe)


def check_tools(recipe) -> str | None:
    """Every domain's tools must resolve: built-in names, importable plug-ins, a search corpus."""
    from rlvr.tools.registry import check_tools as check_domain_tools

    for name, domain in recipe.domains.items():
        problem = check_domain_tools(domain)
        if problem:
            return f"domains.{name}.tools: {problem}"
    return None


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Check a recipe and its data files; exit 0 if valid, 2 with a one-line error if not."""
    load_or_exit(recipe, set_)
    typer.echo(f"{recipe}: ok")


@app.command()
def plan(
    recipe: RecipeArg,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="Write the resolved recipe JSON here.")] = None,
) -> None:
    """Print the resolved recipe, per-step domain quotas and the node/GPU split; write resolved JSON."""
    from rlvr.launch.plan import PlanError, make_plan
    from rlvr.monitor.plan_view import print_plan
    from rlvr.recipe.load import resolved_json
    from rlvr.rundir import RunDir, write_atomic

    resolved = load_or_exit(recipe, set_)
    from rlvr.data.sources import load_recipe_domains

    _, reports = load_recipe_domains(resolved)
    try:
        launch = make_plan(resolved)
    except PlanError as exc:
        raise fail(f"{recipe}: cluster: {exc}") from None
    paths = RunDir.of(resolved)
    if out is None and paths.is_run():  # an existing run's recipe is what eval and a resume read
        print_plan(resolved, launch, reports=reports, resolved_path=None)
        typer.echo(f"not writing {paths.recipe}: it belongs to the run there (pass --out FILE)")
        return
    out = out or paths.recipe
    write_atomic(out, resolved_json(resolved))
    print_plan(resolved, launch, reports=reports, resolved_path=out)


@app.command()
def launch(
    recipe: RecipeArg,
    set_: SetOpt = None,
    resume: Annotated[
        str,
        typer.Option(help="auto: continue from the latest checkpoint if any; none: start fresh; or a checkpoint path."),
    ] = "auto",
    dashboard: Annotated[bool, typer.Option(help="Show the live dashboard.")] = True,
) -> None:
    """Run a recipe: local processes (cluster.kind = local) or a SLURM job (cluster.kind = slurm).

    Rerun the same command to resume a stopped or crashed run from its last checkpoint.
    """
    from rlvr.rundir import RunActive, RunDir

    resolved = load_or_exit(recipe, set_)
    if resolved.model.path is None:
        raise fail(f"{recipe}: model.path: launching needs a model folder (model.config is for tests and plans)")
    paths = RunDir.of(resolved)
    try:
        lock = paths.lock()  # before anything is written: a second launch must not touch the first's files
    except RunActive as exc:
        raise fail(f"{paths.root}: {exc}; wait for it or stop it, or set another experiment.name") from None
    with lock:
        done = paths.finished_at(resolved.experiment.max_steps) if resume == "auto" else None
        if done is not None:
            typer.echo(f"{paths.root}: already finished at {done}/{resolved.experiment.max_steps}; nothing to do")
            raise typer.Exit(0)
        from rlvr.recipe.load import resolved_json

        paths.write_recipe(resolved_json(resolved))
        if resolved.cluster.kind == "local":
            code = _launch_local(resolved, run_dir=paths.root, resume=resume, dashboard=dashboard)
        else:
            code = _launch_slurm(resolved, run_dir=paths.root, dashboard=dashboard)
    raise typer.Exit(code)


def _launch_local(resolved, *, run_dir: Path, resume: str, dashboard: bool) -> int:
    from rlvr.launch.local import LaunchError, run_local
    from rlvr.monitor.metrics import mark_failed
    from rlvr.monitor.progress import final_line

    typer.echo(f"run directory: {run_dir}")
    try:
        code = run_local(resolved, run_dir=run_dir, resume=resume, dashboard=dashboard)
    except LaunchError as exc:
        mark_failed(run_dir, str(exc), name=resolved.experiment.name, max_steps=resolved.experiment.max_steps)
        typer.echo(final_line(run_dir, code=1))
        raise fail(str(exc)) from None
    typer.echo(final_line(run_dir, code=code))
    return code


def _launch_slurm(resolved, *, run_dir: Path, dashboard: bool) -> int:
    from rlvr.launch.sbatch import node_local_paths
    from rlvr.launch.slurm import SlurmError
    from rlvr.launch.slurm import launch as launch_slurm
    from rlvr.recipe.load import resolved_json

    for warning in node_local_paths(resolved, run_dir=run_dir, python=sys.executable):
        typer.echo(f"warning: {warning}", err=True)
    try:
        return launch_slurm(resolved, run_dir=run_dir, recipe_json=resolved_json(resolved), dashboard=dashboard)
    except SlurmError as exc:
        raise fail(str(exc)) from None


@app.command()
def sbatch(
    recipe: RecipeArg,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="Write the script here (default: RUN_DIR/job.sbatch).")] = None,
    submit: Annotated[bool, typer.Option("--submit", help="Also submit it with sbatch.")] = False,
    python: Annotated[
        str | None,
        typer.Option(help="Python every node runs (default: this one); it must exist on the compute nodes."),
    ] = None,
) -> None:
    """Write a plain, commented sbatch script (and the resolved recipe) for submitting by hand."""
    import subprocess

    from rlvr.launch.plan import PlanError, make_plan
    from rlvr.launch.sbatch import node_local_paths, write_sbatch
    from rlvr.recipe.load import changed_keys, resolved_json
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
    if paths.is_run() and paths.recipe.exists():  # the script would resume that run with this recipe
        changes = changed_keys(paths.recipe.read_text(), resolved_json(resolved))
        if changes:
            raise fail(
                f"{run_dir} holds a run made from a different recipe ({'; '.join(changes[:3])}): "
                "set another experiment.name, or remove that run directory"
            )
    python = python or sys.executable
    for warning in node_local_paths(resolved, run_dir=run_dir, python=python):
        typer.echo(f"warning: {warning}", err=True)
    script = write_sbatch(resolved, run_dir=run_dir, recipe_json=resolved_json(resolved), out=out, python=python)
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
    model: Annotated[Path, typer.Argument(help="A HF model folder or a checkpoint (RUN/checkpoints/step_N).")],
    data: Annotated[list[Path], typer.Option("--data", help="Rows to score (jsonl/parquet; repeatable).")],
    reward: Annotated[
        str | None,
        typer.Option(help="Reward for every row (else each row's tag picks its domain's reward from --recipe)."),
    ] = None,
    recipe: Annotated[
        Path | None, typer.Option(help="Recipe whose domains map tags to rewards (default: the checkpoint's run).")
    ] = None,
    args: Annotated[str, typer.Option(help="reward_args as JSON (with --reward).")] = "{}",
    n: Annotated[int, typer.Option(help="Samples per prompt.")] = 1,
    temperature: Annotated[float, typer.Option(help="0 is greedy.")] = 0.0,
    max_new_tokens: Annotated[int, typer.Option(help="Response length limit.")] = 256,
    out: Annotated[Path | None, typer.Option(help="Write per-row results (jsonl) here.")] = None,
) -> None:
    """Score a model or checkpoint on held-out rows with the reward registry."""
    import json

    for file in data:
        if not file.exists():
            raise fail(f"{file}: no such data file")
    if not model.exists():
        raise fail(f"{model}: no such model folder or checkpoint")
    try:
        reward_args = json.loads(args)
    except json.JSONDecodeError as exc:
        raise fail(f"--args: not JSON: {exc.msg}") from None
    from rlvr.data.sources import DataError
    from rlvr.evaluation import evaluate, export_checkpoint, is_checkpoint, load_rows, summarize, write_rows

    tag_rewards: dict[str, tuple[str, dict]] = {}
    template = "auto"
    source = recipe or (model.resolve().parent.parent / "resolved_recipe.json" if is_checkpoint(model) else None)
    if source is not None and source.exists():
        from rlvr.recipe.load import RecipeError, load_recipe, recipe_from_json

        try:
            parsed = (
                recipe_from_json(source.read_text())
                if source.suffix == ".json"
                else load_recipe(source, check_files=False)
            )
        except RecipeError as exc:
            raise fail(str(exc)) from None
        template = parsed.model.chat_template
        tag_rewards = {tag: (d.reward, d.reward_args) for d in parsed.domains.values() for tag in d.tags}
    if reward is None and not tag_rewards:
        raise fail("pass --reward NAME or --recipe R.toml (to map row tags to rewards)")
    try:
        samples = load_rows(data, reward=reward, tag_rewards=tag_rewards)
    except DataError as exc:
        raise fail(str(exc)) from None
    if is_checkpoint(model):
        exported = model / "hf"
        model = exported if (exported / "config.json").exists() else export_checkpoint(model, exported)
    rewards = {s.tag: ((reward, reward_args) if reward else tag_rewards[s.tag]) for s in samples}
    rows = evaluate(
        model,
        samples,
        rewards=rewards,
        chat_template=template,
        n=n,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
    )
    from rich.console import Console
    from rich.table import Table

    table = Table(title="eval", caption=str(model))
    for column in ("tag", "count", "mean", "accuracy"):
        table.add_column(column, justify="left" if column == "tag" else "right")
    for tag, stats in summarize(rows).items():
        table.add_row(tag, str(stats["count"]), f"{stats['mean']:.3f}", f"{stats['accuracy']:.3f}")
    Console().print(table)
    if out is not None:
        write_rows(rows, out)


@app.command()
def export(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint folder (RUN/checkpoints/step_N).")],
    out_dir: Annotated[Path, typer.Argument(help="Where to write the safetensors HF folder.")],
) -> None:
    """Export a checkpoint to a safetensors folder that transformers' from_pretrained loads."""
    from rlvr.evaluation import export_checkpoint, is_checkpoint

    if not is_checkpoint(checkpoint):
        raise fail(f"{checkpoint}: not a complete checkpoint (no meta.json)")
    typer.echo(f"exported {export_checkpoint(checkpoint, out_dir)}")


@app.command()
def monitor(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (output_dir/name).")],
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
) -> None:
    """Attach the live dashboard to a running or finished run."""
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


_mount_subcommands()


@app.command()
def serve(
    model_path: Annotated[Path, typer.Argument(help="HF model folder to serve.")],
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 30000,
    api_key: Annotated[str | None, typer.Option(help="Require this bearer token.")] = None,
    max_batch: Annotated[int, typer.Option(help="Sequences decoded together.")] = 64,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16.")] = "float32",
) -> None:
    """Serve a model with the embedded engine behind SGLang's HTTP routes (+ OpenAI chat)."""
    if not model_path.exists():
        raise fail(f"{model_path}: no such model folder")
    from rlvr.rollout.commands import serve as run_server

    run_server(model_path, host=host, port=port, api_key=api_key, max_batch=max_batch, dtype=dtype)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
