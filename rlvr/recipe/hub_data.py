"""`hf:org/name` data files: a data set on the Hugging Face hub, read from the hub cache while the recipe loads.

As for hub model ids (`rlvr.recipe.hub`), the id becomes local files once, here, so every process reads
the files the launcher resolved and none talks to the hub. A data set is read from the cache only, in
huggingface_hub's layout (`datasets--org--name/refs/<revision>` holds the commit,
`snapshots/<commit>/` the files): rlvr downloads no data set, and one that is missing is one line
naming the id and the `hf download ... --repo-type dataset` command that fills the cache (with
HF_HUB_OFFLINE set, that line says so too). The domain's `hf` table picks the config and split: the
hub's own file layouts are `<config>/<split>-*.parquet`, `data/<split>-*.parquet`, `<split>.jsonl` and
`<config>/<split>/*.parquet` (the parquet export). Its `columns` map the data set's columns to row fields;
the columns are checked here against the files' own (a parquet schema or the first JSON row), so a typo
is one line at validate, not a failed launch. Nothing here imports huggingface_hub or datasets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlvr.recipe.hub import HubError, cached_folder, download_command, hub_cache, hub_offline, looks_like_hub_id

PREFIX = "hf:"
SUFFIXES = (".parquet", ".jsonl", ".json")
PROMPT_FIELDS = ("messages", "prompt")


def is_hub_file(value: str) -> bool:
    return value.startswith(PREFIX)


def dataset_folder(repo_id: str, revision: str, cache: str) -> Path | None:
    """The snapshot folder of data set `repo_id` at `revision` in the cache, or None."""
    return cached_folder(repo_id, revision, cache, repo_type="dataset")


def fill_command(repo_id: str, revision: str) -> str:
    return download_command(repo_id, revision) + " --repo-type dataset"


def split_files(folder: Path, *, config: str | None, split: str) -> list[Path]:
    """The files of `split` (of `config`) in a snapshot, in the hub's layouts; [] when none."""
    bases = [folder / config, folder / "data" / config] if config else [folder / "data", folder, folder / "default"]
    for base in bases:
        for suffix in SUFFIXES:
            found = [
                *base.glob(f"{split}-*{suffix}"),
                *base.glob(f"{split}{suffix}"),
                *base.glob(f"{split}/*{suffix}"),
            ]
            if found:
                return sorted(set(found))
    return []


def _names(folder: Path) -> tuple[list[str], list[str]]:
    """(configs, splits) a snapshot seems to hold, for the message when the asked one is not there."""
    files = [p.relative_to(folder) for suffix in SUFFIXES for p in folder.rglob(f"*{suffix}")]
    configs = sorted({p.parts[0] for p in files if len(p.parts) > 1 and p.parts[0] != "data"})
    splits = sorted({p.parent.name if p.stem.isdigit() else p.stem.split("-")[0] for p in files})
    return configs, splits


def resolve(value: str, *, hf: Any, evaluation: bool, key: tuple[str, ...], check_columns: bool = True) -> list[str]:
    """The local files of `hf:org/name` for the domain's `hf` table (its config, and its split or
    eval_split); HubError about `key` (or the `hf` table's keys) when they are not in the cache, or
    the column map names a column they lack."""
    repo_id = value[len(PREFIX) :]
    if not looks_like_hub_id(repo_id):
        raise HubError(key, f"{value!r} is no hub data set id; write hf:org/name (e.g. hf:openai/gsm8k)")
    cache = hub_cache()
    revision = hf.revision
    folder = dataset_folder(repo_id, revision, cache)
    if folder is None:
        at = f" at revision {revision}" if revision != "main" else ""
        offline = ", and HF_HUB_OFFLINE=1 is set" if hub_offline() else ""
        other = bool(at) and dataset_folder(repo_id, "main", cache) is not None  # there, but not at that revision
        raise HubError(
            (*key[:-1], "hf", "revision") if other else key,
            f"data set {repo_id}{at} is not in the hub cache {cache} (rlvr reads hub data sets from the cache only"
            f"{offline}); fill it with: {fill_command(repo_id, revision)}",
        )
    split = hf.eval_split if evaluation else hf.split
    files = split_files(folder, config=hf.config, split=split)
    if not files:
        configs, splits = _names(folder)
        table = key[:-1] + ("hf",)
        if hf.config is None and configs:
            raise HubError(
                (*table, "config"),
                f"{repo_id} has configs {', '.join(configs)}: pick one with config = ... in the domain's hf table",
            )
        what = "eval_split" if evaluation else "split"
        config = f" of config {hf.config!r}" if hf.config else ""
        raise HubError(
            (*table, "config" if hf.config and hf.config not in configs else what),
            f"{repo_id} has no {split!r} split{config} in {folder} (configs: {', '.join(configs) or 'none'}; "
            f"splits: {', '.join(splits) or 'none'})",
        )
    if check_columns and (problem := columns_problem(files[0], hf.columns, repo_id=repo_id)):
        field, message = problem
        raise HubError((*key[:-1], "hf", "columns", *((field,) if field else ())), message)
    return [str(f) for f in files]


def file_columns(path: Path) -> list[str]:
    """The column names of a parquet file (its schema) or a JSON lines file (its first row)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                return list(row) if isinstance(row, dict) else []
    return []


def columns_problem(path: Path, columns: Mapping[str, str], *, repo_id: str) -> tuple[str, str] | None:
    """(the mapped field, or "" for the whole map; why) when `columns` does not fit the file's columns."""
    have = file_columns(path)
    listed = ", ".join(have) or "none"
    for field, column in columns.items():
        if column not in have:
            return field, f"{repo_id} has no column {column!r} (its columns: {listed})"
    if not any(f in columns or f in have for f in PROMPT_FIELDS):
        return "", (
            f"{repo_id} has no prompt or messages column (its columns: {listed}); map one, "
            f'e.g. columns = {{ prompt = "{have[0] if have else "question"}" }}'
        )
    return None
