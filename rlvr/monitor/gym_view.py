"""`rlvr plan`'s table of the domains whose rows reasoning-gym generates (docs/data.md)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from rlvr.recipe.schema import Recipe


def gym_table(recipe: Recipe) -> Table | None:
    """One row per generator of each gym domain: its config, its weight in a mix, the seeds of the
    training and eval rows, and the system prompt; None when no domain has a gym table."""
    domains = [(name, d.gym) for name, d in recipe.domains.items() if d.gym is not None]
    if not domains:
        return None
    table = Table(title="reasoning-gym rows (generated from seeds: the same on every resume)", title_justify="left")
    for column in ("domain", "dataset", "weight", "config", "train rows", "eval rows", "system prompt"):
        table.add_column(column, justify="right" if column == "weight" else "left", no_wrap=column != "config")
    for name, gym in domains:
        parts = (
            [(gym.dataset, 1.0, gym.config)]
            if gym.dataset is not None
            else [(d.name, d.weight, d.config) for d in gym.datasets]
        )
        total = sum(weight for _, weight, _ in parts)
        for i, (dataset, weight, config) in enumerate(parts):
            first = i == 0
            table.add_row(
                name if first else "",
                dataset,
                "-" if gym.dataset is not None else f"{weight / total:.2f}",
                _inline(config) if config else "(defaults)",
                f"{gym.size} from seed {gym.seed}" if first else "",
                (f"{gym.eval_size} from seed {gym.eval_seed}" if gym.eval_size else "-") if first else "",
                _prompt(gym.system_prompt) if first else "",
            )
    table.caption = "reward gym scores with each dataset's own score_answer on the <answer>...</answer> block"
    return table


def _inline(config: dict[str, Any]) -> str:
    """A config as a TOML inline table: `{ min_vars = 2, max_vars = 4 }`."""
    return "{ " + ", ".join(f"{key} = {_value(value)}" for key, value in config.items()) + " }"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return _inline(value)
    return repr(value)


def _prompt(value: str) -> str:
    if value == "":
        return "none"
    if "<answer>" in value:
        return f"own text ({len(value)} chars)"
    return value
