"""Load prompt rows from jsonl, parquet or a local HF `datasets` folder into `Sample`s.

Rows follow ROLL's field format (`id`, `tag`, `messages` as a list or a JSON string, or
`prompt`; `ground_truth`; `test_cases` + `case_type`; `difficulty`). A malformed row is
reported as `file:line: reason` (the row number for parquet/datasets) so a user can open
the file at the right place; `on_bad_row = "skip"` counts and skips such rows instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlvr.data.base import DataError, LoadReport, kept, needs_ground_truth
from rlvr.rewards.cases import SANDBOX_CASE_TYPES, check_test_cases
from rlvr.rewards.gym import row_problem as gym_row_problem
from rlvr.rewards.verifiers_env import row_problem as verifiers_row_problem
from rlvr.types import Sample

KNOWN_FIELDS = {"id", "tag", "messages", "prompt", "ground_truth", "test_cases", "case_type", "difficulty"}


def read_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield (line or row number, raw row) from one file; JSON errors surface as DataError."""
    path = Path(path)
    if problem := file_problem(path):
        raise DataError(problem)
    if path.is_dir():
        yield from _read_hf_dataset(path)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for number, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield number, row
    elif path.suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    yield number, DataError(f"{path}:{number}: invalid JSON: {exc.msg} (column {exc.colno})")
    else:
        raise DataError(f"{path}: unsupported data file type {path.suffix!r}; expected .jsonl, .parquet or a folder")


def file_problem(path: str | Path) -> str | None:
    """None for what `read_rows` reads, else why not: a directory must be an HF dataset saved with
    `save_to_disk` (it holds `state.json` or `dataset_dict.json`), not a folder of data files."""
    path = Path(path)
    if path.is_dir() and not ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        return (
            f"{path} is a directory; expected a .jsonl/.json/.parquet file or a saved HF dataset folder "
            "(datasets' save_to_disk)"
        )
    return None


def _read_hf_dataset(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import datasets  # pyright: ignore[reportMissingImports]
    except ImportError:
        raise DataError(f"{path}: is a folder; reading HF datasets needs `pip install rlvr[datasets]`") from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001 - a damaged folder: one line, not datasets' traceback
        raise DataError(f"{path}: cannot load the saved HF dataset: {type(exc).__name__}: {exc}") from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    yield from enumerate(loaded, start=1)


def row_to_sample(
    row: Any, *, where: str, default_tag: str | None, reward: str, reward_args: dict[str, Any] | None = None
) -> Sample:
    """Validate one row; raises ValueError with the reason (the caller adds file:line)."""
    if isinstance(row, DataError):
        raise row
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    tag = row.get("tag", default_tag)
    if not isinstance(tag, str) or not tag:
        raise ValueError("missing 'tag' (the domain's tags say which reward judges the row)")
    messages = _messages(row)
    case_type = row.get("case_type")
    test_cases = _maybe_json(row.get("test_cases"))
    if needs_ground_truth(reward, reward_args) and row.get("ground_truth") in (None, "", []):
        extra = " (template 'reference')" if reward == "llm_judge" else ""
        raise ValueError(f"{reward} rows need 'ground_truth'{extra}")
    if reward == "code_sandbox":
        if case_type not in SANDBOX_CASE_TYPES:
            raise ValueError(f"'case_type' must be one of {', '.join(SANDBOX_CASE_TYPES)}, got {case_type!r}")
        if test_cases in (None, "", []):
            raise ValueError("code_sandbox rows need 'test_cases'")
        if problem := check_test_cases(case_type, test_cases):  # else every sample of the row scores 0
            raise ValueError(problem)
    if reward == "gym" and (problem := gym_row_problem(row.get("gym"))):
        raise ValueError(problem)
    if reward == "verifiers" and (problem := verifiers_row_problem(row.get("verifiers"))):
        raise ValueError(problem)
    difficulty = row.get("difficulty")
    if difficulty == "":
        difficulty = None
    if difficulty is not None:
        try:
            difficulty = float(difficulty)  # ROLL writes it as a string such as "3.0"
        except (TypeError, ValueError):
            raise ValueError(f"'difficulty' must be a number, got {difficulty!r}") from None
    return Sample(
        id=str(row.get("id", where)),
        tag=tag,
        messages=messages,
        ground_truth=row.get("ground_truth"),
        test_cases=test_cases,
        case_type=case_type,
        difficulty=difficulty,
        extra={k: v for k, v in row.items() if k not in KNOWN_FIELDS},
    )


def map_columns(row: Any, columns: dict[str, str]) -> Any:
    """The row with each mapped column moved to its field (`prompt` <- `question`); ValueError naming
    the column a row lacks (the map is `domains.NAME.hf.columns`)."""
    if not isinstance(row, dict):
        return row
    out = dict(row)
    for field, column in columns.items():
        if column not in row:
            raise ValueError(f"no column {column!r} for hf.columns.{field} (the row has {', '.join(row) or 'none'})")
        out.pop(column, None)
    for field, column in columns.items():
        out[field] = row[column]
    return out


def _messages(row: dict[str, Any]) -> list[dict[str, str]]:
    messages = row.get("messages")
    if messages is None:
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("needs 'messages' (list or JSON string) or a non-empty 'prompt' string")
        return [{"role": "user", "content": prompt}]
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as exc:
            raise ValueError(f"'messages' is a string but not JSON: {exc.msg}") from None
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"messages[{i}].content must be a string")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _maybe_json(value: Any) -> Any:
    """ROLL stores test_cases as a JSON string; decode it when it is one."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def load_domain_samples(
    files: list[str],
    *,
    domain: str,
    tags: list[str],
    reward: str,
    reward_args: dict[str, Any] | None = None,
    on_bad_row: str = "error",
    min_difficulty: float | None = None,
    max_difficulty: float | None = None,
    max_prompt_chars: int | None = None,
    report: LoadReport | None = None,
    any_tag: bool = False,
    columns: dict[str, str] | None = None,
) -> list[Sample]:
    """All rows of a domain's files as Samples (filters applied), or DataError on a bad row.

    `any_tag` (eval files): rows keep whatever tag they carry (one per benchmark) instead of
    having to be one of the domain's training tags; the domain's reward judges them all.
    `columns` (the domain's `hf.columns`): row field -> the column that holds it, for data sets
    whose columns are not rlvr's fields (`{prompt = "question", ground_truth = "answer"}`).
    """
    report = report if report is not None else LoadReport()
    default_tag = tags[0] if len(tags) == 1 else None
    samples: list[Sample] = []
    for file in files:
        for number, row in read_rows(file):
            where = f"{file}:{number}"
            try:
                if columns:
                    row = map_columns(row, columns)
                sample = row_to_sample(
                    row, where=where, default_tag=default_tag, reward=reward, reward_args=reward_args
                )
                if sample.tag not in tags and not any_tag:
                    raise ValueError(f"tag {sample.tag!r} is not owned by domain {domain!r} (tags: {tags})")
            except (ValueError, DataError) as exc:
                message = str(exc) if isinstance(exc, DataError) else f"{where}: {exc}"
                if on_bad_row == "error":
                    raise DataError(message) from None
                report.skipped += 1
                report.first_skip = report.first_skip or message
                continue
            samples.append(sample)
    return kept(samples, domain=domain, lo=min_difficulty, hi=max_difficulty, max_chars=max_prompt_chars, report=report)


def load_recipe_domains(
    recipe: Any, *, eval_files: bool = False
) -> tuple[dict[str, list[Sample]], dict[str, LoadReport]]:
    """Every domain's train (or eval) samples for a validated Recipe, with a LoadReport each."""
    out: dict[str, list[Sample]] = {}
    reports: dict[str, LoadReport] = {}
    if any(getattr(d, "gym", None) is not None for d in recipe.domains.values()):
        from rlvr.data.gym import generate, gym_tables

        try:  # every gym table's rows at once (one child process); a failing one is named by its domain below
            generate(gym_tables(recipe.domains.values()))
        except (DataError, ImportError) as exc:
            raise DataError(f"domains with a gym table: {exc}") from None
    for name, domain in recipe.domains.items():
        report = reports[name] = LoadReport()
        key = "eval_files" if eval_files else "files"
        files = getattr(domain, key)
        for file in files:
            if problem := file_problem(file):
                raise DataError(f"domains.{name}.{key}: {problem}")
        out[name] = load_domain_samples(
            files,
            domain=name,
            tags=domain.tags,
            reward=domain.reward,
            reward_args=domain.reward_args,
            on_bad_row=recipe.data.on_bad_row,
            min_difficulty=domain.filter.min_difficulty,
            max_difficulty=domain.filter.max_difficulty,
            max_prompt_chars=domain.filter.max_prompt_chars,
            report=report,
            any_tag=eval_files,
            columns=dict(domain.hf.columns),
        )
        if getattr(domain, "gym", None) is not None:  # rows generated by reasoning-gym (rlvr/data/gym.py)
            from rlvr.data.gym import gym_samples

            out[name] += gym_samples(name, domain, evaluation=eval_files, report=report)
        if getattr(domain, "verifiers", None) is not None:  # rows of a verifiers taskset (rlvr/data/verifiers_rows.py)
            from rlvr.data.verifiers_rows import verifiers_samples

            out[name] += verifiers_samples(name, domain, evaluation=eval_files, report=report)
    return out, reports
