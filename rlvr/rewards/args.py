"""The `reward_args` each built-in reward accepts.

Kept apart from the reward modules (which pull in math-verify, aiohttp or the sandbox) so
that `rlvr validate` can reject a misspelt argument — `timout_s` — before a run starts,
without importing any of them. The reward modules read their sets from here, so there is
one list to keep current.
"""

from __future__ import annotations

KNOWN_ARGS: dict[str, frozenset[str]] = {
    "math_rule": frozenset({"fallback", "format_weight", "require_think", "timeout_s", "max_answer_chars", "max_workers"}),
    "code_sandbox": frozenset({
        "partial_credit", "timeout_s", "memory_mb", "max_procs", "max_output_bytes", "max_scratch_mb",
        "sandbox", "sandbox_mode", "e2b_template", "python",
    }),
    "llm_judge": frozenset({
        "judge_url", "model", "api_key_env", "template", "timeout_s", "max_retries", "backoff_s",
        "max_concurrency", "temperature", "max_tokens",
    }),
    "qa_match": frozenset({"metric", "format_weight"}),
}  # fmt: skip


def reject_unknown_args(name: str, reward_args: dict) -> None:
    """Raise the run-time error for keys a built-in does not take (validate reports them earlier)."""
    known = KNOWN_ARGS[name]
    unknown = set(reward_args) - known
    if unknown:
        raise ValueError(f"{name}: unknown reward_args {sorted(unknown)}; known: {sorted(known)}")
