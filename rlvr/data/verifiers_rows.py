"""Rows from a verifiers (v1) taskset: a domain's `[domains.NAME.verifiers]` table instead of its `files`.

The taskset (`taskset`, its config keys `args`) is loaded once per process and its first `size` tasks
become the training rows; with `eval_args`, the taskset loaded again with those keys over `args` gives
the eval rows (eval_files' role, e.g. `{ split = "test" }`). Each task's system prompt and prompt become
the row's messages; `sample.extra["verifiers"]` keeps what rebuilds the task where the `verifiers`
reward scores it (rlvr/rewards/verifiers_env.py). A task without a prompt (the user opens the
conversation) or a multi-turn taskset is refused in one line. docs/rewards.md ("verifiers domains").
"""

from __future__ import annotations

from typing import Any

from rlvr.data.base import DataError, LoadReport, kept
from rlvr.rewards.verifiers_env import (
    TasksetError,
    VerifiersMissing,
    loaded,
    single_turn_problem,
    task_data,
    task_row,
    verifiers,
)
from rlvr.types import Sample

Problem = tuple[tuple[str, ...], str]
"""(recipe key path, what is wrong and how to fix it): what `rlvr validate` prints with the TOML line."""


def eval_args(table: Any) -> dict[str, Any]:
    """The eval rows' config keys: `args` updated by `eval_args`."""
    return {**table.args, **(table.eval_args or {})}


def check_verifiers(recipe: Any) -> Problem | None:
    """Every verifiers table names a taskset that imports, takes its config keys and is single-turn;
    verifiers is installed wherever one is used. Imports verifiers only when a recipe has such a table."""
    for name, domain in recipe.domains.items():
        table = getattr(domain, "verifiers", None)
        if table is None:
            continue
        where = ("domains", name, "verifiers")
        try:
            verifiers()
        except VerifiersMissing as exc:
            return where, str(exc)
        for key, args in (("args", table.args), ("eval_args", eval_args(table))):
            if key == "eval_args" and table.eval_args is None:
                continue
            try:
                cls, config = loaded(table.taskset, args)
            except TasksetError as exc:
                path = exc.key if exc.key[0] == "taskset" else (key, *exc.key[1:])
                return (*where, *path), str(exc)
            if problem := single_turn_problem(cls, config):
                return (*where, "taskset"), problem
    return None


def messages(data: Any) -> list[dict[str, str]]:
    """The row's chat prompt: the task's system prompt, then its prompt (text or messages, as text)."""
    from verifiers.v1.types import content_text  # pyright: ignore[reportMissingImports]

    out = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    else:
        out += [{"role": m.role, "content": content_text(m.content)} for m in data.prompt or []]
    return out


def verifiers_samples(name: str, domain: Any, *, evaluation: bool, report: LoadReport | None = None) -> list[Sample]:
    """A verifiers domain's training rows (or its eval rows) as Samples, with the domain's filter
    applied. DataError (`domains.NAME.verifiers: ...`) when verifiers is missing, the taskset does
    not load or is multi-turn, or its load() raises."""
    table = domain.verifiers
    report = report if report is not None else LoadReport()
    if evaluation and table.eval_args is None:
        return []
    args = eval_args(table) if evaluation else dict(table.args)
    limit = table.eval_size if evaluation else table.size
    key = f"domains.{name}.verifiers"
    try:
        cls, config = loaded(table.taskset, args)
    except (VerifiersMissing, TasksetError) as exc:
        raise DataError(f"{key}: {exc}") from None
    if problem := single_turn_problem(cls, config):
        raise DataError(f"{key}.taskset: {problem}")
    try:
        made = task_data(table.taskset, args, limit=limit)
    except Exception as exc:  # noqa: BLE001 - the taskset's own load() failed: one line naming it
        text = " ".join(str(exc).split())
        raise DataError(f"{key}: {cls.__name__}.load() raised {type(exc).__name__}: {text}") from None
    samples: list[Sample] = []
    split = "eval" if evaluation else "train"
    for data in made:
        if data.prompt is None:
            raise DataError(
                f"{key}.taskset: task {data.idx} of {cls.__name__} has no prompt (the user opens the conversation: "
                "multi-turn); rlvr runs single-turn verifiers tasksets only"
            )
        sample = Sample(
            id=str(data.id) if data.id is not None else f"{name}-{split}-{data.idx}",
            tag=domain.tags[0],
            messages=messages(data),
            extra={"verifiers": task_row(table.taskset, args, data)},
        )
        samples.append(sample)
    f = domain.filter
    return kept(
        samples, domain=name, lo=f.min_difficulty, hi=f.max_difficulty, max_chars=f.max_prompt_chars, report=report
    )
