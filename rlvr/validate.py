"""`rlvr validate`'s checks as one function, run by `validate`, `plan`, `launch` and `sbatch` alike.

In order: the recipe (TOML, schema, paths, hub ids); the rewards, gym tables and tools it names
(plug-ins imported); this machine (model folder, tokenizer, GPUs, memory); then every data file and
its prompts against `data.max_prompt_tokens`. The first error ends the checks, so a user reads one
line. Every result is a `Problem` (error, warning, note, or an info line for stdout), in the order
the CLI prints them, so the CLI only prints. It lives above `rlvr.recipe` because it imports the
rewards, data and tools it checks. No torch or transformers: `validate` runs on login nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlvr.data.base import DataError
from rlvr.data.gym import check_gym
from rlvr.data.prompt_fit import DataCheck, Messages, check_data, counting_tokenizer
from rlvr.data.sources import load_recipe_domains
from rlvr.data.verifiers_rows import check_verifiers
from rlvr.plugins import add_plugin_dir
from rlvr.recipe.checks import cpu_dtype_note, family_note, machine_problems
from rlvr.recipe.hub import HubMode, pending_values, report_lines
from rlvr.recipe.load import Locator, RecipeError, load_recipe_with_hub
from rlvr.recipe.schema import Recipe
from rlvr.recipe.staleness import staleness_warnings
from rlvr.rewards.registry import check_reward_args, check_reward_name
from rlvr.tools.base import ToolConfigError
from rlvr.tools.registry import check_tools
from rlvr.tools.session import Toolbox

KeyProblem = tuple[tuple[str, ...], str]
"""A check's failure: the recipe key it is about and the message (`Locator.error` places it)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One line for the user: an `error` (exit 2), a `warning` or `note` (stderr), or `info` (stdout)."""

    level: Literal["error", "warning", "note", "info"]
    text: str


@dataclass(slots=True)
class Validation:
    """What the checks found: the recipe and its data check (when they got that far), and the lines."""

    recipe: Recipe | None = None
    data: DataCheck | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def error(self) -> str | None:
        """The error that ended the checks (always the last line), or None when the recipe is valid."""
        last = self.problems[-1] if self.problems else None
        return last.text if last is not None and last.level == "error" else None

    def add(self, level: Literal["error", "warning", "note", "info"], lines: Sequence[str]) -> Validation:
        self.problems += [Problem(level, line) for line in lines]
        return self


def validate_recipe(
    path: Path,
    overrides: Sequence[str] = (),
    *,
    check_machine: bool = True,
    hub: HubMode = "download",
    announce: Callable[[str], None] | None = None,
) -> Validation:
    """Every check of the recipe at `path` with its `--set` overrides, in order, up to the first error.

    `check_machine`: False for `plan`, which previews a run that may be meant for another machine.
    `hub`: how much of a hub id's snapshot to fetch (`rlvr.recipe.hub`); `announce` hears of a
    download before it starts."""
    found = Validation()
    try:
        recipe, snapshots = load_recipe_with_hub(path, list(overrides), hub=hub, announce=announce)
    except RecipeError as exc:
        return found.add("error", [str(exc)])
    found.recipe = recipe
    found.add("info", report_lines(snapshots, slurm=recipe.cluster.kind == "slurm"))
    add_plugin_dir(path.parent)  # `my_reward:score` beside the recipe; the processes launch starts inherit it
    where = Locator(path, path.read_text(), list(overrides))
    pending = pending_values(snapshots)  # validate's peek at an uncached id: launch downloads the rest
    problem = plugin_problem(recipe) or (machine_problems(recipe, pending=pending) if check_machine else None)
    if problem:
        return found.add("error", [where.error(*problem)])
    found.add("warning", staleness_warnings(recipe))  # what asynchronous rollout asks of the lr
    try:
        data = rows_check(recipe)
    except DataError as exc:
        return found.add("error", [str(exc)])
    if data.problem:
        return found.add("error", [where.error(*data.problem)])
    found.data = data
    found.add("warning", data.warnings)
    found.add("note", [note] if (note := family_note(recipe)) else [])
    if check_machine:  # what a valid recipe will do that it does not say; `plan` may be for another machine
        found.add("note", [note] if (note := cpu_dtype_note(recipe)) else [])
    return found


def plugin_problem(recipe: Recipe) -> KeyProblem | None:
    """Every domain's reward must be registered (or an importable plug-in) and take its reward_args;
    its gym tables must name what reasoning-gym has (docs/data.md); its tools must resolve."""
    for name, domain in recipe.domains.items():
        problem = check_reward_name(domain.reward)
        if problem:
            return ("domains", name, "reward"), problem
        problem = check_reward_args(domain.reward, domain.reward_args)
        if problem:
            return ("domains", name, "reward_args"), problem
    return check_gym(recipe) or check_verifiers(recipe) or tools_problem(recipe)


def tools_problem(recipe: Recipe) -> KeyProblem | None:
    """Every domain's tools must resolve: built-in names, importable plug-ins, a search corpus."""
    for name, domain in recipe.domains.items():
        problem = check_tools(domain)
        if problem:
            return ("domains", name, "tools"), problem
    return None


def rows_check(recipe: Recipe) -> DataCheck:
    """Every train and eval row loaded and checked (`rlvr.data.prompt_fit.check_data`; its `problem`
    is about a recipe key, a domain's tools too). DataError for a file that does not load."""
    train, reports = load_recipe_domains(recipe)
    evals, eval_reports = load_recipe_domains(recipe, eval_files=True)  # a run reads these too
    tokenizer, not_counted = counting_tokenizer(recipe)
    messages, problem = tool_messages(recipe, tokenizer) if tokenizer is not None else (None, None)
    if problem:
        return DataCheck(problem=problem, reports=reports)
    return check_data(
        recipe, train=train, evals=evals, reports=reports, eval_reports=eval_reports, tokenizer=tokenizer,
        messages=messages, not_counted=not_counted,
    )  # fmt: skip


def tool_messages(recipe: Recipe, tokenizer: Any) -> tuple[dict[str, Messages], KeyProblem | None]:
    """Per domain that lists its tools in the prompt: a row's messages as the model sees them,
    rendered by the same `Toolbox.prompt_messages` as the rollout's, or the domain whose tools do
    not build. The search index is not built for this (the search tool's description is the same
    with a URL)."""
    out: dict[str, Messages] = {}
    for name, d in recipe.domains.items():
        if d.tools and d.tool_instructions:
            domain = d.model_copy(update={"search_url": d.search_url or "http://index.not.built"})
            try:
                box = Toolbox.for_domain(
                    domain, tokenizer=tokenizer, default_tokens=recipe.rollout.max_new_tokens,
                    chat_template=recipe.model.chat_template,
                )  # fmt: skip
            except ToolConfigError as exc:
                return out, (("domains", name, "tools"), str(exc))
            out[name] = lambda sample, box=box: box.prompt_messages(sample.messages)
    return out, None
