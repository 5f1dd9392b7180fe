"""`math_rule`: extract the final answer and check it against `sample.ground_truth`.

The text after the last `</think>` is judged (an unclosed `<think>` is judged whole, not zeroed).
Extraction and equivalence are math-verify's own (`parse`, `\\boxed{}` first, then its anchors and,
with `fallback = "last_number"`, anchorless matches; then `verify`). Our own steps in front: a
boxed answer equal to the gold is accepted without a worker round trip, and `normalise` reads the
answer kinds docs/rewards.md decides. Everything else runs in a worker process because sympy can
hang: a call past `timeout_s` kills and replaces its worker.

reward_args: `fallback`, `format_weight`, `require_think`, `timeout_s`, `max_answer_chars`,
`float_rounding`, `allow_set_relation_comp`, `allow_arithmetic` (defaults and meaning: docs/rewards.md, math_rule).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from rlvr.rewards.args import reject_unknown_args
from rlvr.rewards.base import zero
from rlvr.rewards.registry import register
from rlvr.rewards.text import model_text, split_think
from rlvr.types import Completion, RewardResult, Sample

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_BARE_RE = re.compile(r"\\boxed\s+([^\s$]+)")
_ANSWER_IS_RE = re.compile(r"answer\s+is\s*:?\s*(.+?)\s*(?:\.\s|\.$|$|\n)", re.IGNORECASE)
_ANSWER_COLON_RE = re.compile(r"answer\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_DELIMITED_RE = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_WORD_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")  # a word that is not a LaTeX command
_NUMBER_ONLY_RE = re.compile(r"^\s*[-+]?\d[\d,. ]*\s*$")
# Arithmetic between numbers (`237 * 682`, `48+24`, `\\frac{9}{3}`, `2^{10}`): sympy would evaluate it,
# doing the model's arithmetic for it; against an integer gold it is refused (`allow_arithmetic`).
_ARITHMETIC_RE = re.compile(r"\d\s*(?:[*×·+/^÷-]|\\times|\\cdot|\\div)\s*[-+({]*\s*\d|\\[dt]?frac|\\sqrt")
_INTEGER_RE = re.compile(r"^\s*[-+]?\d[\d, ]*\s*$")
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+)?")
# Words that are LaTeX arguments, not prose: `pmatrix` of \begin{pmatrix}, ` and ` of \text{ and }.
_LATEX_WORDS_RE = re.compile(r"\\(?:begin|end|text|textbf|mathrm|operatorname)\s*\{[^{}]*\}")
# Inline math whose delimiters sit alone at a line's end and start (`$` / `\(`, newline, the
# answer, newline, `$` / `\)`), no blank line inside: TeX reads a single newline in math as a space.
_SPLIT_DOLLAR_RE = re.compile(r"(?<![\\$\d])\$[^\S\n]*\n((?:[^\S\n]*[^\s$][^\n$]*\n){1,8})[^\S\n]*\$(?!\$)")
_SPLIT_PAREN_RE = re.compile(r"\\\([^\S\n]*\n((?:[^\S\n]*(?!\\\))\S(?:(?!\\\))[^\n])*\n){1,8})[^\S\n]*\\\)")
_ESCAPED_DOLLAR_RE = re.compile(r"\\\$\s?(?=[-+]?\.?\d)")  # `\$10`: a currency sign, like the `$` of `$10`
_TRAILING_BREAK_RE = re.compile(r"\\\\\s*(?=\}|\$|\\\]|\\\)|\Z)")  # `\boxed{5 \\}`: a line break carries no value
_TRAILING_BACKSLASH_RE = re.compile(r"(?<!\\)\\\s*\Z")


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


def _as_list(ground_truth: Any) -> list:
    return list(ground_truth) if isinstance(ground_truth, list | tuple) else [ground_truth]


def _normalised(s: str) -> str:
    return re.sub(r"\s+", "", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def _warmup() -> None:
    """Worker preload: import math-verify and run one check so the first real job is fast."""
    judge_text("\\frac{1}{2}", "$0.5$", timeout_s=5)


@functools.cache
def _configs(*, anchorless: bool) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [
        LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=anchorless),
        ExprExtractionConfig(try_extract_without_anchor=anchorless),
    ]


def _bare_answer(text: str) -> bool:
    """Short, no LaTeX delimiters, no prose words, and not a plain number with separators."""
    if len(text) >= 200 or _DELIMITED_RE.search(text) or _WORD_RE.search(_LATEX_WORDS_RE.sub("", text)):
        return False
    return not (_NUMBER_ONLY_RE.match(text) and ", " not in text)


def _join_lines(match: re.Match) -> str:
    opener, closer = ("$", "$") if match.group(0).startswith("$") else ("\\(", "\\)")
    return f"{opener} {' '.join(line.strip() for line in match.group(1).splitlines())} {closer}"


def normalise(text: str) -> str:
    """Our steps before math-verify reads a text (a response or a gold); each is decided in docs/rewards.md:

    * inline math split over lines (`$` at a line's end, the answer, `$` at the next line's start;
      the same with `\\(`/`\\)`) is joined onto one line, as TeX reads it (math-verify reads inline
      math on one line only);
    * an escaped dollar before a number (`\\$10`) is a currency sign and is dropped;
    * a trailing line break `\\\\` before a closing brace or delimiter, and one trailing `\\`
      at the very end, are dropped (`\\boxed{5 \\\\}`, `10\\`).
    """
    text = _SPLIT_DOLLAR_RE.sub(_join_lines, text)
    text = _SPLIT_PAREN_RE.sub(_join_lines, text)
    text = _ESCAPED_DOLLAR_RE.sub("", text)
    text = _TRAILING_BREAK_RE.sub("", text)
    return _TRAILING_BACKSLASH_RE.sub("", text)


def _parse(text: str, *, anchorless: bool, seconds: int) -> list:
    """math-verify's parse, with our steps in front: `normalise`, then a short bare answer is read as LaTeX.

    Plain math-verify reads `10, 4, -2` or `\\frac34i` without `$` as its last number
    (`-2`, `4`); a gold (or a one-line reply) is usually just the answer, so it is wrapped in
    `$...$` first, unless it has prose words (`I got 12`) or is a plain number whose commas/spaces are digit separators
    (`7,425,000`, `1,22`, `1 000`), which math-verify's own number reading gets right.
    """
    from math_verify import parse

    configs = _configs(anchorless=anchorless)
    text = normalise(text)
    if _bare_answer(text):
        parsed = parse(f"${text}$", extraction_config=configs, parsing_timeout=seconds)
        if parsed:
            return parsed
    return parse(text, extraction_config=configs, parsing_timeout=seconds)


def judge_text(
    gold: str,
    text: str,
    *,
    fallback: str = "last_number",
    timeout_s: float = 5,
    max_chars: int = 1000,
    float_rounding: int = 6,
    allow_set_relation_comp: bool = False,
    allow_arithmetic: bool = False,
) -> tuple[bool, str]:
    """(correct, extracted answer) for a whole response. Runs inside a pool worker.

    Called in the worker's main thread, so math-verify's signal-based timeouts are active
    as a first line; the pool's kill is the backstop.
    """
    from math_verify import verify

    seconds = max(1, int(timeout_s / 3))  # three guarded steps: two parses and a verify
    answer = _parse(text, anchorless=fallback == "last_number", seconds=seconds)
    extracted = str(answer[-1]) if answer else ""
    if not answer or len(extracted) > max_chars or (undone_arithmetic(gold, extracted) and not allow_arithmetic):
        return False, extracted
    gold_parsed = _parse(gold, anchorless=True, seconds=seconds)
    if not gold_parsed:
        return False, extracted
    correct = verify(
        gold_parsed,
        answer,
        float_rounding=float_rounding,
        allow_set_relation_comp=allow_set_relation_comp,
        timeout_seconds=seconds,
    )
    return bool(correct), extracted


def undone_arithmetic(gold: str, answer: str) -> bool:
    """An answer that is arithmetic on numbers against a gold that is an integer: `237 * 682` for
    161634. math-verify would evaluate it and accept; a policy learns to restate the question.
    An equation's value is what follows its last `=`: `14 + 25 = 39` states 39."""
    return bool(_INTEGER_RE.match(gold)) and bool(_ARITHMETIC_RE.search(answer.rsplit("=", 1)[-1]))


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
    float_rounding = int(reward_args.get("float_rounding", 6))
    set_relation = bool(reward_args.get("allow_set_relation_comp", False))
    arithmetic = bool(reward_args.get("allow_arithmetic", False))

    text = model_text(completion)
    raw_golds = [str(g).strip() for g in _as_list(sample.ground_truth) if g is not None and str(g).strip()]
    if not raw_golds:
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

    if method == "boxed" and len(_BOX_RE.findall(judged)) == 1 and answer is not None:
        plain_golds = [_clean(g) for g in raw_golds if "\\boxed" not in g]  # a boxed gold may hold several answers
        if any(_normalised(answer) == _normalised(g) for g in plain_golds):
            return result(1.0, "exact match")

    from rlvr.rewards.workers import shared_pool

    pool = shared_pool("math", max_workers=reward_args.get("max_workers"), preload=("rlvr.rewards.math_rule:_warmup",))
    timed_out, extracted, undone = False, False, False
    for gold in raw_golds:
        job = await pool.call(
            "rlvr.rewards.math_rule:judge_text",
            gold,
            judged,
            fallback=fallback,
            timeout_s=timeout_s,
            max_chars=max_chars,
            float_rounding=float_rounding,
            allow_set_relation_comp=set_relation,
            allow_arithmetic=arithmetic,
        )
        if job.status == "ok":
            correct, found = job.value
            extracted = extracted or bool(found)
            if found:
                info["answer"] = found[:200]
                undone = undone or (undone_arithmetic(gold, found) and not arithmetic)
            if correct:
                return result(1.0, "equivalent")
        timed_out = timed_out or job.status == "timeout"
        if job.status in ("error", "crash"):
            info["verify_error"] = job.error
    if timed_out:
        info["timeout"] = True
        return result(0.0, "timeout")
    if not extracted:
        return result(0.0, "no answer found")
    if undone:
        return result(0.0, "arithmetic left undone: the answer must be the number (allow_arithmetic)")
    return result(0.0, "not equivalent")
