# docs/examples/my_reward.py: a plug-in reward, `reward = "my_reward:score"` in a recipe beside it
"""The response's last line equals the row's ground_truth (case-insensitive unless told)."""

from rlvr.types import Completion, RewardResult, Sample


def score(sample: Sample, completion: Completion, case_sensitive: bool = False) -> RewardResult:
    if sample.ground_truth is None:  # nothing to judge against: failed (not trained on), not 0
        raise ValueError(f"row {sample.id} has no ground_truth")
    if completion.finish_reason == "length":
        return RewardResult(0.0, {"reason": "truncated"})
    lines = completion.text.strip().splitlines()
    answer, gold = (lines[-1].strip() if lines else ""), str(sample.ground_truth).strip()
    if not case_sensitive:
        answer, gold = answer.lower(), gold.lower()
    if answer == gold:
        return RewardResult(1.0, {"reason": "exact match"})
    return RewardResult(0.0, {"reason": f"expected {gold!r}, got {answer!r}"})
