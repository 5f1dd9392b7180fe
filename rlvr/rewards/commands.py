"""`rlvr rewards`: list the rewards, and score completions offline from a JSONL file.

Kept import-light (typer and rlvr.rewards.registry only at module level) so `rlvr --help`
stays instant; rich, the rewards and the recipe loader are imported inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from rlvr.rewards.registry import describe

app = typer.Typer(
    help="Reward functions: list them, or score completions from a JSONL file offline.", no_args_is_help=True
)


@app.command("list")
def list_rewards() -> None:
    """Show every built-in reward with its one-line description."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rewards (plug-ins: package.module:function)")
    table.add_column("name", style="bold")
    table.add_column("description")
    for name, doc in describe():
        table.add_row(name, doc)
    Console().print(table)


class RowError(ValueError):
    pass


def row_to_sample(row: Any) -> tuple[Any, Any]:
    """(Sample, Completion) from a `check` row; RowError with the reason for a bad row."""
    from rlvr.types import Completion, Sample

    if not isinstance(row, dict):
        raise RowError(f"expected a JSON object, got {type(row).__name__}")
    if "completion" not in row or not isinstance(row["completion"], str):
        raise RowError("missing 'completion' (the response text to score)")
    messages = row.get("messages")
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as exc:
            raise RowError(f"'messages' is a string but not JSON: {exc}") from exc
    if messages is None and isinstance(row.get("prompt"), str):
        messages = [{"role": "user", "content": row["prompt"]}]
    if not isinstance(messages, list):
        raise RowError("needs 'messages' (list of {role, content}) or 'prompt' (string)")
    known = {"id", "tag", "messages", "prompt", "ground_truth", "test_cases", "case_type", "difficulty", "completion"}
    known |= {"finish_reason"}  # as `rlvr eval --out` writes it; "length": cut at the token limit
    known |= {"own_text"}  # a tool episode's own turns, as samples.jsonl writes them (what rewards judge)
    finish = row.get("finish_reason") or "stop"
    if finish not in ("stop", "length", "abort"):
        raise RowError(f"'finish_reason' must be 'stop', 'length' or 'abort', got {finish!r}")
    sample = Sample(
        id=str(row.get("id", "")),
        tag=str(row.get("tag", "")),
        messages=messages,
        ground_truth=row.get("ground_truth"),
        test_cases=row.get("test_cases"),
        case_type=row.get("case_type"),
        difficulty=row.get("difficulty"),
        extra={k: v for k, v in row.items() if k not in known},
    )
    own = row.get("own_text")
    return sample, Completion(text=row["completion"], token_ids=[], logprobs=[], finish_reason=finish,
                              own_text=own if isinstance(own, str) else None)  # fmt: skip


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)  # the line every rlvr command prints for bad input
    return typer.Exit(2)


@app.command("check")
def check(
    file: Path = typer.Argument(..., help="JSONL: one Sample row per line plus 'completion' (string)."),
    reward: str | None = typer.Option(None, "--reward", "-r", help="Reward name or package.module:function."),
    args: str = typer.Option("{}", "--args", help="reward_args as a JSON object."),
    recipe: Path | None = typer.Option(
        None, "--recipe", help="Take reward and reward_args from the domain owning each row's tag."
    ),
) -> None:
    """Score completions offline and print id, score and reason per row, then a summary.

    Exits 2 on bad input (file, row, reward, args), 1 when a row's reward failed (it raised, or
    returned something that is not a number: a run would leave that sample out of training).
    """
    import asyncio

    from rlvr.plugins import add_plugin_dir
    from rlvr.rewards.cases import check_test_cases
    from rlvr.rewards.registry import check_reward_args, check_reward_name, get_reward

    try:
        reward_args = json.loads(args)
    except json.JSONDecodeError as exc:
        raise _fail(f"--args: not JSON: {exc}") from None
    if not isinstance(reward_args, dict):
        raise _fail("--args: expected a JSON object")
    by_tag: dict[str, tuple[str, dict[str, Any]]] = {}
    add_plugin_dir(recipe.parent if recipe is not None else Path.cwd())  # as validate and the trainer import them
    if recipe is not None:
        from rlvr.recipe.load import load_recipe

        try:
            loaded = load_recipe(recipe, check_files=False)
        except Exception as exc:  # noqa: BLE001 - the loader's message names file and line
            raise _fail(f"{recipe}: {exc}") from None
        for domain in loaded.domains.values():
            for tag in domain.tags:
                by_tag[tag] = (domain.reward, {**domain.reward_args, **reward_args})
    elif reward is None:
        raise _fail("give --reward NAME or --recipe R.toml")
    if reward is not None and (problem := check_reward_name(reward)):
        raise _fail(f"--reward: {problem}")
    for name, _ in by_tag.values() if reward is None else []:
        if problem := check_reward_name(name):
            raise _fail(f"{recipe}: reward {name}: {problem}")
    # the check `rlvr validate` runs: a misspelt argument would otherwise score every row 0
    for name, row_args in [(reward, reward_args)] if reward is not None else by_tag.values():
        if problem := check_reward_args(name, row_args):
            raise _fail(f"--args: {problem}")
    if not file.exists():
        raise _fail(f"{file}: no such file")

    rows = []
    for lineno, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            sample, completion = row_to_sample(json.loads(line))
        except (json.JSONDecodeError, RowError) as exc:
            raise _fail(f"{file}:{lineno}: {exc}") from None
        if reward is not None:
            name, row_args = reward, reward_args
        elif sample.tag in by_tag:
            name, row_args = by_tag[sample.tag]
        else:
            raise _fail(f"{file}:{lineno}: tag {sample.tag!r} is owned by no domain of {recipe}")
        if name == "code_sandbox" and (problem := check_test_cases(sample.case_type, sample.test_cases)):
            raise _fail(f"{file}:{lineno}: {problem}")
        rows.append((lineno, sample, completion, name, row_args))

    async def score_all() -> list[Any]:
        from rlvr.rewards.base import safe_score

        fns = {name: get_reward(name) for _, _, _, name, _ in rows}
        return await asyncio.gather(*(safe_score(fns[n], s, c, **a) for _, s, c, n, a in rows))

    try:
        results = asyncio.run(score_all())
    except (KeyError, ImportError, AttributeError, TypeError) as exc:
        raise _fail(f"reward: {exc}") from None
    finally:
        from rlvr.rewards.workers import close_shared_pools

        close_shared_pools()

    from rich.console import Console
    from rich.table import Table

    table = Table(title=str(file))
    for column in ("id", "score", "reason"):
        table.add_column(column)
    failures = []  # (line, cause): the reward raised or returned no number
    for (lineno, sample, _, _, _), result in zip(rows, results, strict=True):
        cause = row_failure(result)
        if cause is not None:
            failures.append((lineno, cause))
            table.add_row(sample.id, "failed", cause)
        else:
            table.add_row(sample.id, f"{result.score:.3f}", str(result.info.get("reason", "")))
    console = Console()
    console.print(table)
    scores = [r.score for r in results if row_failure(r) is None]
    mean = sum(scores) / len(scores) if scores else 0.0
    over = f" over the {len(scores)} judged" if failures else ""
    judged = f"mean score {mean:.3f}{over}, {sum(s >= 1.0 for s in scores)} at 1.0" if scores else "none judged"
    console.print(f"{len(results)} rows, {judged}, {len(failures)} failed")
    if failures:
        lineno, cause = failures[0]
        typer.echo(
            f"error: the reward failed on {len(failures)} of {len(results)} rows (a run would not train on them); "
            f"first: {file}:{lineno}: {cause}",
            err=True,
        )
        raise typer.Exit(1)


def row_failure(result: Any) -> str | None:
    """Why a reward could not score a row (it raised, or returned no number), or None if it did."""
    cause = getattr(result, "failed", None)
    if cause is None and result.info.get("error"):  # a reward that flags its own error
        cause = str(result.info.get("reason") or "error")
    return cause
