"""qa_match: normalised exact match and token F1 against a reference answer (or its aliases).

Scored as HotpotQA and Search-R1 do: lower-case, drop punctuation and the articles a/an/the,
collapse whitespace; exact match is 1 when the normalised prediction equals a normalised
alias, F1 is the best token-overlap F1 over the aliases. The prediction is the last
`<answer>...</answer>` block when there is one, else the last non-empty line (after any
`</think>`), so tool results earlier in a multi-turn episode are not mistaken for the answer.

reward_args: `metric` ("em", default, or "f1": which one is the score; both are in `info`),
`format_weight` (w in [0, 1]: score = (1 - w) * metric + w * [an <answer> block exists]).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from rlvr.rewards.args import reject_unknown_args
from rlvr.rewards.base import zero
from rlvr.rewards.registry import register
from rlvr.rewards.text import model_text, split_think
from rlvr.types import Completion, RewardResult, Sample

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    return " ".join(_ARTICLES_RE.sub(" ", text.lower().translate(_PUNCT)).split())


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = normalize(prediction).split(), normalize(reference).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or common == 0:
        return float(pred == ref)
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def extract_answer(text: str) -> tuple[str, bool]:
    """(the predicted answer, whether it came from an <answer> block)."""
    body, _ = split_think(text)
    blocks = _ANSWER_RE.findall(body)
    if blocks:
        return blocks[-1].strip(), True
    lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else ""), False


def aliases(ground_truth: Any) -> list[str]:
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, list | tuple) and all(isinstance(a, str) for a in ground_truth):
        return list(ground_truth)
    if isinstance(ground_truth, dict) and "target" in ground_truth:  # Search-R1's {"target": [...]}
        return aliases(ground_truth["target"])
    return []


@register("qa_match")
async def score(sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Normalised exact match / token F1 of the answer against ground_truth (a string or aliases)."""
    reject_unknown_args("qa_match", reward_args)
    metric = reward_args.get("metric", "em")
    if metric not in ("em", "f1"):
        raise ValueError(f"qa_match: metric must be 'em' or 'f1', got {metric!r}")
    weight = float(reward_args.get("format_weight", 0.0))
    refs = aliases(sample.ground_truth)
    if not refs:
        return zero("ground_truth is not a string or a list of strings")
    prediction, tagged = extract_answer(model_text(completion))
    if not prediction:
        return zero("no answer", formatted=tagged)
    em = float(any(normalize(prediction) == normalize(r) for r in refs))
    f1 = max(token_f1(prediction, r) for r in refs)
    main = em if metric == "em" else f1
    info: dict[str, Any] = {"em": em, "f1": f1, "answer": prediction[:200]}
    if main == 0.0:
        info["reason"] = "the answer matches no alias"  # every zero says why (the reward contract)
    return RewardResult((1 - weight) * main + weight * float(tagged), info)
