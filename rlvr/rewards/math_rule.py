"""`math_rule`: extract the final answer and check it against `sample.ground_truth`.

Extraction is ours (cheap regexes, in the calling process): the text after the last
`</think>` (an unclosed `<think>` is *not* a failure: the whole text is judged, unlike
ROLL's rule that zeroes any response containing `<think>`), then the last `\\boxed{}` /
`\\fbox{}` (brace-matched), else the last "the answer is X", else the last "Answer: X",
else (configurable) the last number. Equivalence is math-verify's (`parse` + `verify`:
numbers, fractions, LaTeX, sets, intervals, percentages, units), run in a worker process
because sympy can hang: a call past `timeout_s` kills and replaces its worker.

reward_args:
  fallback        "last_number" (default) or "none": what to do without an explicit answer.
  format_weight   0..1 (default 0): score = (1-w)*correct + w*format_ok.
  require_think   (default false) format_ok also needs a closed <think>...</think> first.
  timeout_s       per-verification deadline in seconds (default 10).
  max_answer_chars  longer extracted answers score 0 (default 1000; keeps sympy bounded).
"""

from __future__ import annotations

import re
from typing import Any

from rlvr.rewards.args import reject_unknown_args
from rlvr.rewards.base import zero
from rlvr.rewards.registry import register
from rlvr.rewards.text import split_think
from rlvr.types import Completion, RewardResult, Sample

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_BARE_RE = re.compile(r"\\boxed\s+([^\s$]+)")
_ANSWER_IS_RE = re.compile(r"answer\s+is\s*:?\s*(.+?)\s*(?:\.\s|\.$|$|\n)", re.IGNORECASE)
_ANSWER_COLON_RE = re.compile(r"answer\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` with nested braces; None if absent or unclosed."""
    matches = list(_BOX_RE.finditer(text))
    for match in reversed(matches):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            ch = text[i]
            if ch == "{" and text[i - 1] != "\\":
                depth += 1
            elif ch == "}" and text[i - 1] != "\\":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    bare = list(_BOX_BARE_RE.finditer(text))
    return bare[-1].group(1).strip() if bare else None


def _clean(answer: str) -> str:
    answer = answer.strip().strip("$").strip()
    answer = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", answer).strip()
    return answer.rstrip(".").strip()


def extract_answer(text: str, *, fallback: str = "last_number") -> tuple[str | None, str]:
    """(answer, method): method is boxed | answer_is | answer_colon | last_number | none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return _clean(boxed), "boxed"
    for method, regex in (("answer_is", _ANSWER_IS_RE), ("answer_colon", _ANSWER_COLON_RE)):
        found = regex.findall(text)
        if found and _clean(found[-1]):
            return _clean(found[-1]), method
    if fallback == "last_number":
        numbers = _NUMBER_RE.findall(text)
        if numbers:
            return numbers[-1].replace(" ", ""), "last_number"
    return None, "none"


def gold_answers(ground_truth: Any) -> list[str]:
    """Accept a string, a number, or a list of acceptable answers; a boxed gold is unboxed."""
    items = ground_truth if isinstance(ground_truth, list | tuple) else [ground_truth]
    out = []
    for item in items:
        if item is None:
            continue
        text = str(item).strip()
        boxed = last_boxed(text)
        out.append(_clean(boxed if boxed is not None else text))
    return [g for g in out if g]


def _normalised(s: str) -> str:
    return re.sub(r"\s+", "", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def _warmup() -> None:
    """Worker preload: import math-verify and run one check so the first real job is fast."""
    verify_answer("\\frac{1}{2}", "0.5", timeout_s=5)


def _parse(text: str, timeout_s: int) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    wrapped = text if "$" in text or "\\(" in text else f"${text}$"
    parsed = parse(wrapped, extraction_config=config, parsing_timeout=timeout_s)
    if not parsed and wrapped != text:
        parsed = parse(text, extraction_config=config, parsing_timeout=timeout_s)
    return parsed


def verify_answer(gold: str, answer: str, *, timeout_s: float = 5) -> bool:
    """True if math-verify finds `answer` equivalent to `gold`. Runs inside a pool worker.

    Called in the worker's main thread, so math-verify's signal-based timeouts are active
    as a first line; the pool's kill is the backstop.
    """
    from math_verify import verify

    seconds = max(1, int(timeout_s / 3))  # three guarded steps: two parses and a verify
    gold_parsed = _parse(gold, seconds)
    answer_parsed = _parse(answer, seconds)
    if not gold_parsed or not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=seconds))


def format_ok(text: str, *, require_think: bool) -> bool:
    """Has a boxed answer after the reasoning, and (if required) a closed think block first."""
    judged, closed = split_think(text)
    if require_think and not (closed and text.lstrip().startswith("<think>")):
        return False
    return last_boxed(judged) is not None


@register("math_rule")
async def score(sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Extract the final answer (\\boxed{}, 'the answer is', last number) and check it with math-verify."""
    reject_unknown_args("math_rule", reward_args)
    fallback = reward_args.get("fallback", "last_number")
    if fallback not in ("last_number", "none"):
        raise ValueError(f"math_rule: fallback must be 'last_number' or 'none', got {fallback!r}")
    format_weight = float(reward_args.get("format_weight", 0.0))
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"math_rule: format_weight must be in [0, 1], got {format_weight}")
    timeout_s = float(reward_args.get("timeout_s", 10.0))
    max_chars = int(reward_args.get("max_answer_chars", 1000))

    text = completion.text if isinstance(completion.text, str) else ""
    golds = gold_answers(sample.ground_truth)
    if not golds:
        return zero("sample has no ground_truth")
    judged, _ = split_think(text)
    answer, method = extract_answer(judged, fallback=fallback)
    fmt = format_ok(text, require_think=bool(reward_args.get("require_think", False))) if format_weight else False
    info: dict[str, Any] = {"method": method, "answer": (answer or "")[:200]}
    if format_weight:
        info["format_ok"] = fmt

    def result(correct: float, reason: str) -> RewardResult:
        info["correct"] = bool(correct)
        return RewardResult((1.0 - format_weight) * correct + format_weight * float(fmt), {"reason": reason, **info})

    if answer is None:
        return result(0.0, "no answer found")
    if len(answer) > max_chars:
        return result(0.0, f"answer longer than {max_chars} chars")
    if any(_normalised(answer) == _normalised(g) for g in golds):
        return result(1.0, "exact match")

    from rlvr.rewards.workers import shared_pool

    pool = shared_pool("math", max_workers=reward_args.get("max_workers"), preload=("rlvr.rewards.math_rule:_warmup",))
    timed_out = False
    for gold in golds:
        job = await pool.call("rlvr.rewards.math_rule:verify_answer", gold, answer, timeout_s=timeout_s)
        if job.status == "ok" and job.value:
            return result(1.0, "equivalent")
        timed_out = timed_out or job.status == "timeout"
        if job.status in ("error", "crash"):
            info["verify_error"] = job.error
    if timed_out:
        info["timeout"] = True
        return result(0.0, "timeout")
    return result(0.0, "not equivalent")
