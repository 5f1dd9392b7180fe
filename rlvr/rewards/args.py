"""The `reward_args` each built-in reward accepts.

Kept apart from the reward modules (which pull in math-verify, aiohttp or the sandbox) so
that `rlvr validate` can reject a misspelt argument — `timout_s` — before a run starts,
without importing any of them. The reward modules read their sets from here, and the sets are
the keys of `VALUE_RULES`, so there is one table to keep current.
"""

from __future__ import annotations

# -- values ----------------------------------------------------------------------------------
# What each argument must hold. `rlvr validate` and `rlvr rewards check` run these, so a value
# the reward would reject on its first call (`format_weight = 1.5`), or one that would quietly
# misbehave (`timeout_s = "5"`, a judge template with `{answer}`), stops the run before it starts.

JUDGE_FIELDS = frozenset({"prompt", "response", "reference"})


def judge_mode(template: str) -> str:
    """`reference` (YES/NO against the row's ground_truth) or `rubric` (a 0-10 score): the named
    templates say so, a custom one is `reference` when it shows the judge {reference}."""
    if template in ("reference", "rubric"):
        return template
    return "reference" if "{reference}" in template else "rubric"


def _number(*, low: float | None = None, high: float | None = None, positive: bool = False, integer: bool = False):
    kind = "an integer" if integer else "a number"
    bounds = " > 0" if positive else (f" in [{low:g}, {high:g}]" if high is not None else f" >= {low:g}")
    rule = kind + (bounds if positive or low is not None else "")

    def check(value: object) -> str | None:
        numeric = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, numeric):
            return f"expected {rule}, got {value!r}"
        if positive and value <= 0 or low is not None and value < low or high is not None and value > high:
            return f"expected {rule}, got {value!r}"
        return None

    return check


def _choice(*options: str):
    def check(value: object) -> str | None:
        return None if value in options else f"expected one of {', '.join(map(repr, options))}, got {value!r}"

    return check


def _of(kind: type):
    def check(value: object) -> str | None:
        return None if isinstance(value, kind) else f"expected a {kind.__name__}, got {value!r}"

    return check


def _judge_template(value: object) -> str | None:
    """`reference`, `rubric`, or text whose only placeholders are {prompt}, {response}, {reference}."""
    import string

    if not isinstance(value, str):
        return f"expected 'reference', 'rubric' or a template string, got {value!r}"
    if value in ("reference", "rubric"):
        return None
    try:
        fields = {field for _, field, _, _ in string.Formatter().parse(value) if field is not None}
    except ValueError as exc:
        return f"not a valid template ({exc}); write literal braces as {{{{ }}}}"
    unknown = sorted(fields - JUDGE_FIELDS)
    if unknown:
        return f"unknown placeholder {{{unknown[0]}}}; a template may use {{prompt}}, {{response}}, {{reference}}"
    if "response" not in fields:
        return "the template never shows the judge the {response}"
    return None


GYM_ANSWER_SOURCES = ("tag", "boxed", "last_number")
"""Where the `gym` reward may read the answer, tried in the order `answer_from` lists them."""


def _sources(*options: str):
    """A non-empty list drawn from `options`, no repeats: the order is the order of preference."""
    allowed = ", ".join(map(repr, options))

    def check(value: object) -> str | None:
        good = isinstance(value, list) and value and all(v in options for v in value) and len(set(value)) == len(value)
        return None if good else f"expected a non-empty list of {allowed} (each once, tried in order), got {value!r}"

    return check


_FRACTION = _number(low=0, high=1)
_SECONDS = _number(positive=True)
_COUNT = _number(low=1, integer=True)
VALUE_RULES: dict[str, dict[str, object]] = {
    "math_rule": {
        "fallback": _choice("last_number", "none"), "format_weight": _FRACTION, "require_think": _of(bool),
        "timeout_s": _SECONDS, "max_answer_chars": _COUNT, "max_workers": _COUNT,
        "float_rounding": _number(low=0, integer=True), "allow_set_relation_comp": _of(bool),
        "allow_arithmetic": _of(bool),
    },
    "code_sandbox": {
        "partial_credit": _of(bool), "timeout_s": _SECONDS, "memory_mb": _COUNT, "max_procs": _COUNT,
        "max_output_bytes": _COUNT, "max_scratch_mb": _COUNT, "sandbox": _choice("local", "e2b"),
        "sandbox_mode": _choice("auto", "bwrap", "unshare", "insecure"), "e2b_template": _of(str), "python": _of(str),
    },
    "llm_judge": {
        "judge_url": _of(str), "model": _of(str), "api_key_env": _of(str), "template": _judge_template,
        "timeout_s": _SECONDS, "max_retries": _number(low=0, integer=True), "backoff_s": _number(low=0),
        "down_wait_s": _number(low=0), "max_concurrency": _COUNT, "temperature": _number(low=0), "max_tokens": _COUNT,
    },
    "qa_match": {"metric": _choice("em", "f1"), "format_weight": _FRACTION},
    # The verifier is the dataset's own; its system prompt is the domain's gym.system_prompt.
    "gym": {"answer_from": _sources(*GYM_ANSWER_SOURCES)},
    # The taskset scores with its own rewards (its keys are the verifiers table's args), in reward workers.
    "verifiers": {"timeout_s": _SECONDS, "max_workers": _COUNT},
}  # fmt: skip


KNOWN_ARGS: dict[str, frozenset[str]] = {name: frozenset(rules) for name, rules in VALUE_RULES.items()}
"""The keys each built-in takes: those with a value rule, so a new argument is added in one place."""


def reject_unknown_args(name: str, reward_args: dict) -> None:
    """Raise the run-time error for keys a built-in does not take (validate reports them earlier)."""
    known = KNOWN_ARGS[name]
    unknown = set(reward_args) - known
    if unknown:
        raise ValueError(f"{name}: unknown reward_args {sorted(unknown)}; known: {sorted(known)}")


def check_arg_values(name: str, reward_args: dict) -> str | None:
    """None if every known argument of a built-in holds a usable value, else `key: what is wrong`."""
    rules = VALUE_RULES.get(name, {})
    for key, value in reward_args.items():
        rule = rules.get(key)
        problem = rule(value) if callable(rule) else None
        if problem:
            return f"{key}: {problem}"
    return None
