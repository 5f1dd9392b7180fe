"""gym: score with the reasoning-gym dataset's own verifier.

A row's `gym` field (`sample.extra`, set when a `[domains.NAME.gym]` table generates it) holds what
`score_answer(answer, entry)` needs. The answer is read as reasoning-gym reads it (the last
`<answer>` block) or, with `answer_from`, from a `\boxed{}` or the reply's last number, for models
that never write the tag; the verdict is the dataset's, rlvr adds no matching of its own. No answer
scores 0 with a reason; a verifier that raises is a failed verdict, as for every reward.
reasoning-gym is imported only when scoring, so `rlvr validate` does not pay for it (sympy,
matplotlib). docs/rewards.md ("gym").
"""

from __future__ import annotations

import functools
import json
import numbers
import re
from collections.abc import Sequence
from typing import Any

from rlvr.rewards.args import check_arg_values, reject_unknown_args
from rlvr.rewards.base import describe_exception, failed, zero
from rlvr.rewards.math_rule import last_boxed
from rlvr.rewards.registry import register
from rlvr.rewards.text import model_text, split_think
from rlvr.types import Completion, RewardResult, Sample

INSTALL = "pip install -e '.[gym]'"
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_TEXT = re.compile(r"\\text\{([^{}]*)\}")  # `\boxed{\text{yes}}` answers `yes`
LABELS = {"tag": "<answer>...</answer> block", "boxed": "\\boxed{}", "last_number": "number"}


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


def numeric(gold: object) -> bool:
    """Whether the gold answer is a number: only then can a reply's last number be its answer."""
    if isinstance(gold, bool):
        return False
    return isinstance(gold, numbers.Real) or isinstance(gold, str) and NUMBER.fullmatch(gold.strip()) is not None


def find_answer(text: str, sources: Sequence[str], *, gold: object) -> tuple[str | None, str | None]:
    """(the answer, the source it came from) from the first of `sources` that has one, else (None, None).

    The tag is read from the whole reply, as reasoning-gym reads it; `boxed` and `last_number` only after
    the last `</think>`."""
    from reasoning_gym.utils import extract_answer  # pyright: ignore[reportMissingImports]

    judged, _ = split_think(text)
    for source in sources:
        if source == "tag":
            answer = extract_answer(text)
        elif source == "boxed":
            boxed = last_boxed(judged)  # balanced braces; None when unclosed
            answer = None if boxed is None else _TEXT.sub(r"\1", boxed).strip().strip("$").strip()
        else:
            found = NUMBER.findall(judged) if numeric(gold) else []
            answer = found[-1] if found else None
        if answer is not None:
            return answer, source
    return None, None


def nothing_found(sources: Sequence[str], *, gold: object) -> str:
    """The reason of a reply with no answer in any source."""
    labels = [LABELS[source] for source in sources if source != "last_number" or numeric(gold)]
    reason = "no " + " or ".join(labels) if labels else "no answer"
    if "last_number" in sources and not numeric(gold):
        reason += " (the gold answer is not a number: last_number does not apply)"
    return reason


@register("gym")
def score(sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Score the <answer> with the reasoning-gym dataset's own score_answer (rows from a gym table)."""
    reject_unknown_args("gym", reward_args)
    if problem := check_arg_values("gym", reward_args):
        raise ValueError(f"gym: {problem}")
    sources = reward_args.get("answer_from", ["tag"])
    gym = sample.extra.get("gym")
    if problem := row_problem(gym):
        return failed(f"row {sample.id}: {problem}")
    assert isinstance(gym, dict)
    name, entry = gym["dataset"], gym["entry"]
    text = model_text(completion)
    answer, source = find_answer(text, sources, gold=entry.get("answer"))
    if answer is None:
        return zero(nothing_found(sources, gold=entry.get("answer")), dataset=name)
    try:
        value = verifier(name, gym.get("config") or {}).score_answer(answer, entry)
    except GymMissing as exc:
        return failed(str(exc), dataset=name)
    except Exception as exc:  # noqa: BLE001 - a verifier that raises could not judge: failed, not a 0
        return failed(f"reasoning-gym {name}.score_answer raised {describe_exception(exc)}", dataset=name, error=True)
    if not isinstance(value, numbers.Real):
        return failed(f"reasoning-gym {name}.score_answer returned {value!r}, not a number", dataset=name)
    info: dict[str, Any] = {"answer": answer[:200], "dataset": name, "answer_from": source}
    if value == 0:
        info["reason"] = f"{name}.score_answer gave 0"  # every zero says why (the reward contract)
    return RewardResult(float(value), info)
