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
    return sample, Completion(text=row["completion"], token_ids=[], logprobs=[])


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
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
    """Score completions offline and print id, score and reason per row, then a summary."""
    import asyncio

    from rlvr.rewards.registry import check_reward_args, check_reward_name, get_reward

    try:
        reward_args = json.loads(args)
    except json.JSONDecodeError as exc:
        raise _fail(f"--args: not JSON: {exc}") from None
    if not isinstance(reward_args, dict):
        raise _fail("--args: expected a JSON object")
    by_tag: dict[str, tuple[str, dict[str, Any]]] = {}
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
    for (_, sample, _, _, _), result in zip(rows, results, strict=True):
        table.add_row(sample.id, f"{result.score:.3f}", str(result.info.get("reason", "")))
    console = Console()
    console.print(table)
    scores = [r.score for r in results]
    mean = sum(scores) / len(scores) if scores else 0.0
    errors = sum(bool(r.info.get("error")) for r in results)
    console.print(f"{len(scores)} rows, mean score {mean:.3f}, {sum(s >= 1.0 for s in scores)} at 1.0, {errors} errors")
