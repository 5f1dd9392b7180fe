"""A plug-in reward for recipes/smollm2_mix.toml: the reasoning-gym dataset's own verifier, on the
answer a small chat model actually writes.

    reward = "smollm2.gym_answer:score"   # (the recipe's folder is on the plug-in path)

The built-in `gym` reward takes the answer from `<answer>...</answer>` (reasoning-gym's
extract_answer) and scores 0 without one. SmolLM2-135M-Instruct almost never writes that tag: of
about 1,000 greedy replies to letter_counting, syllogism, aiw, spell_backward, needle_haystack,
number_sequence and word_sorting questions, with the request in the system message or the question,
with or without an example, only word_sorting replies used it, nearly always copying the prompt's
placeholder (`<answer>your answer</answer>`); asked for `\\boxed{}` instead, it boxed nothing. The
`gym` reward gave 0.00-0.04 on every candidate and GRPO had no signal (docs/models.md, "A real
model on three domains"). It does answer in words: `The letter "r" appears 2 times in the text`.
So the answer is, in this order: the last `<answer>` block (as
`gym`), else the last `\\boxed{...}`, else the last number of the reply (for datasets whose answers
are numbers, such as letter_counting); the verdict is the dataset's own `score_answer`, through the
built-in `gym` reward (same failures, same info).
"""

from __future__ import annotations

import dataclasses
import re

from rlvr.rewards.gym import score as gym_score
from rlvr.types import Completion, RewardResult, Sample

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return re.sub(r"\\text\{([^{}]*)\}", r"\1", text[i + 1 : j]).strip().strip("$").strip()
    return None  # unclosed


def answer_of(text: str, gold: object) -> tuple[str | None, str]:
    """(the answer, where it was found)."""
    if "<answer>" in text and "</answer>" in text:
        return None, "answer tag"  # the built-in gym reward reads it itself
    if (boxed := last_boxed(text)) is not None:
        return boxed, "boxed"
    if isinstance(gold, str) and NUMBER.fullmatch(gold.strip()) and (numbers := NUMBER.findall(text)):
        return numbers[-1], "last number"
    return None, "none"


def score(sample: Sample, completion: Completion) -> RewardResult:
    text = completion.text if isinstance(completion.text, str) else ""
    text = text.rsplit("</think>", 1)[-1]
    gym = sample.extra.get("gym")
    gold = gym.get("entry", {}).get("answer") if isinstance(gym, dict) else None
    answer, source = answer_of(text, gold)
    if source == "none":
        return RewardResult(0.0, {"reason": "no <answer>, \\boxed{} or number in the reply"})
    if answer is not None:
        completion = dataclasses.replace(completion, text=f"<answer>{answer}</answer>")
    result = gym_score(sample, completion)
    result.info["answer_from"] = source
    return result
