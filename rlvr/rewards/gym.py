"""gym: score with the reasoning-gym dataset's own verifier.

reasoning-gym (`pip install -e '.[gym]'`) generates tasks procedurally, each dataset with its own
`score_answer(answer, entry)`. A row carries what that call needs in its `gym` field (`sample.extra`):
`{"dataset": NAME, "config": {...}, "entry": {"question", "answer", "metadata"}}` — the rows of a
`[domains.NAME.gym]` domain get it when they are generated (rlvr/data/gym.py). The answer is taken
as reasoning-gym takes it, with its own `extract_answer` (the last `<answer>...</answer>` block),
and the verdict is the dataset's: rlvr adds no matching of its own.

- No `<answer>` block: 0 (`reason`), without calling the verifier.
- The verifier raises, or returns no number: *failed* (not trained on), as for every reward.

Nothing here imports reasoning-gym at module level: `rlvr validate` reaches this module for the
reward's name and arguments without paying for its import (about a second: sympy, matplotlib).
"""

from __future__ import annotations

import functools
import json
import numbers
from typing import Any

from rlvr.rewards.args import reject_unknown_args
from rlvr.rewards.base import describe_exception, failed, zero
from rlvr.rewards.registry import register
from rlvr.types import Completion, RewardResult, Sample

INSTALL = "pip install -e '.[gym]'"


class GymMissing(ImportError):
    """reasoning-gym is not installed; `str()` says how to install it."""


def reasoning_gym() -> Any:
    """The `reasoning_gym` package, or GymMissing with the install command."""
    try:
        import reasoning_gym  # pyright: ignore[reportMissingImports]
    except ImportError as exc:
        raise GymMissing(f"reasoning-gym is not installed: {INSTALL}") from exc
    return reasoning_gym


def row_problem(gym: Any) -> str | None:
    """None if a row's `gym` field holds what the reward needs, else why not (a data error)."""
    if not isinstance(gym, dict):
        return "gym rows need a 'gym' object: {dataset, config, entry} (rows of a [domains.NAME.gym] domain have it)"
    if not isinstance(gym.get("dataset"), str) or not gym["dataset"]:
        return "'gym.dataset' must name a reasoning-gym dataset"
    if not isinstance(gym.get("config", {}), dict):
        return "'gym.config' must be an object (the generator's config keys)"
    entry = gym.get("entry")
    if not isinstance(entry, dict) or not isinstance(entry.get("question"), str):
        return "'gym.entry' must be the reasoning-gym entry: {question, answer, metadata}"
    return None


@functools.lru_cache(maxsize=64)
def _verifier(name: str, config_json: str) -> Any:
    """A dataset instance of `name` with `config`, made once per process: its `score_answer` is the
    verifier (some datasets read their config while scoring)."""
    return reasoning_gym().create_dataset(name, seed=0, **json.loads(config_json))


def verifier(name: str, config: dict[str, Any]) -> Any:
    return _verifier(name, json.dumps(config, sort_keys=True))


@register("gym")
def score(sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Score the <answer> with the reasoning-gym dataset's own score_answer (rows from a gym table)."""
    reject_unknown_args("gym", reward_args)
    gym = sample.extra.get("gym")
    if problem := row_problem(gym):
        return failed(f"row {sample.id}: {problem}")
    assert isinstance(gym, dict)
    name, entry = gym["dataset"], gym["entry"]
    from reasoning_gym.utils import extract_answer  # pyright: ignore[reportMissingImports]

    text = completion.text if isinstance(completion.text, str) else ""
    answer = extract_answer(text)
    if answer is None:
        return zero("no <answer>...</answer> block", dataset=name)
    try:
        value = verifier(name, gym.get("config") or {}).score_answer(answer, entry)
    except GymMissing as exc:
        return failed(str(exc), dataset=name)
    except Exception as exc:  # noqa: BLE001 - a verifier that raises could not judge: failed, not a 0
        return failed(f"reasoning-gym {name}.score_answer raised {describe_exception(exc)}", dataset=name, error=True)
    if not isinstance(value, numbers.Real):
        return failed(f"reasoning-gym {name}.score_answer returned {value!r}, not a number", dataset=name)
    info: dict[str, Any] = {"answer": answer[:200], "dataset": name}
    if value == 0:
        info["reason"] = f"{name}.score_answer gave 0"  # every zero says why (the reward contract)
    return RewardResult(float(value), info)
