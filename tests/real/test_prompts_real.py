"""A prompt's token ids are the real tokenizer's `apply_chat_template(messages, add_generation_prompt=True)`
in all three places that tokenize it: the rollout (what the rollout manager sends to the engine, and its
in-run eval), validate's prompt-length count (jinja2 + `tokenizers`, no torch), and `rlvr eval`.

SmolLM2-135M-Instruct's ChatML template is the case the tiny test models miss: it inserts a default
system message ("You are a helpful AI assistant named SmolLM, ...") when a row has none, and its
bos token `<|im_start|>` (id 1) opens every turn, so a second BOS added by the tokenizer on top of
the template's would show as `[1, 1, ...]`. Every check runs on a row without and a row with a
system message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlvr.recipe.schema import Recipe
from rlvr.types import Completion, Group, RewardResult, Sample

BOS = 1  # <|im_start|>
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
ROWS = [
    {"id": "plain", "tag": "sums", "prompt": "What is 12 + 34? Answer with the number only.", "ground_truth": "46"},
    {
        "id": "system",
        "tag": "sums",
        "messages": [
            {"role": "system", "content": "You add numbers."},
            {"role": "user", "content": "What is 7 + 8?"},
        ],
        "ground_truth": "15",
    },
]


def samples() -> list[Sample]:
    from rlvr.data.sources import row_to_sample

    out = []
    for row in ROWS:
        sample = row_to_sample(row, where="test", default_tag="sums", reward="math_rule")
        sample.domain = "sums"
        out.append(sample)
    return out


def recipe_dict(model_dir: Path, files: list[str]) -> dict[str, Any]:
    return {
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"prompts_per_step": len(ROWS)},
        "domains": {"sums": {"tags": ["sums"], "files": files, "eval_files": files, "reward": "math_rule"}},
        "rollout": {"n": 2, "max_new_tokens": 4, "temperature": 1.0},
        "trainer": {"strategy": "none", "micro_batch_size": 1},
        "algorithm": {"preset": "grpo", "kl_in": "none", "kl_coef": 0.0},
    }


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def reference(hf_tokenizer: Any) -> dict[str, list[int]]:
    """Row id -> `apply_chat_template(messages, add_generation_prompt=True)`: the ids the model was
    tuned on (transformers 5 returns a BatchEncoding, 4 a list)."""
    out = {}
    for sample in samples():
        ids = hf_tokenizer.apply_chat_template(sample.messages, add_generation_prompt=True)
        out[sample.id] = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return out


def test_the_reference_itself_has_one_bos_per_turn_and_the_default_system_message(
    reference: dict[str, list[int]], hf_tokenizer: Any
) -> None:
    plain, system = reference["plain"], reference["system"]
    assert plain[:2] != [BOS, BOS] and system[:2] != [BOS, BOS]
    # system + user + the generation prompt: three turns, each opened by <|im_start|>
    assert plain.count(BOS) == 3 and system.count(BOS) == 3
    assert DEFAULT_SYSTEM in hf_tokenizer.decode(plain)
    assert DEFAULT_SYSTEM not in hf_tokenizer.decode(system) and "You add numbers." in hf_tokenizer.decode(system)


class RecordingEngine:
    """Answers every request with one token ("5") and remembers the prompt ids it was sent."""

    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    async def generate(self, requests: list[Any]) -> list[Completion]:
        out = []
        for request in requests:
            self.sent.append(list(request.input_ids))
            for _ in range(getattr(request, "n", 1)):
                out.append(
                    Completion(
                        text="5",
                        token_ids=[20],
                        logprobs=[-0.5],
                        finish_reason="stop",
                        prompt_token_ids=list(request.input_ids),
                    )  # fmt: skip
                )
        return out


class ZeroRewards:
    threshold = 1.0

    async def score_groups(self, groups: list[Group]) -> dict[str, float]:
        for group in groups:
            group.rewards = [RewardResult(0.0) for _ in group.completions]
        return {}

    def close(self) -> None:
        pass


def test_the_rollout_sends_the_chat_template_ids(smollm2_dir: Path, reference: dict[str, list[int]]) -> None:
    """The worker's own tokenizer (`rlvr.trainer.model.load_tokenizer`) in the rollout manager: the
    ids of a training step and of the in-run eval are the reference's, byte for byte."""
    from rlvr.collect.manager import RolloutManager
    from rlvr.trainer.model import load_tokenizer

    recipe = Recipe.model_validate(recipe_dict(smollm2_dir, ["x"]))
    tokenizer = load_tokenizer(recipe.model)
    engine = RecordingEngine()
    rows = samples()
    manager = RolloutManager(
        recipe, train={"sums": rows}, evals={"sums": rows}, tokenizer=tokenizer,
        client=engine, rewards=ZeroRewards(),  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        manager.start(version=0)
        manager.take(0)
        trained = sorted(engine.sent)
        engine.sent.clear()
        manager.evaluate(0)
        evaluated = sorted(engine.sent)
    finally:
        manager.close()
    want = sorted(reference.values())
    assert trained == want
    assert evaluated == want
    assert manager.prompts.prompt_text(rows[0]).startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>")


def test_validate_counts_the_chat_template_ids(smollm2_dir: Path, reference: dict[str, list[int]], tmp_path) -> None:
    """validate renders with jinja2 and tokenizes with `tokenizers` (no torch): the same ids, so its
    `longest` and the rows it says are too long are the rollout's."""
    from rlvr.data.base import LoadReport
    from rlvr.data.chat import render_prompt
    from rlvr.data.prompt_fit import check_data, counting_tokenizer, prompt_lengths
    from rlvr.recipe.tokenizer import FastTokenizer

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    recipe = Recipe.model_validate(recipe_dict(smollm2_dir, [str(data)]))
    tokenizer, why = counting_tokenizer(recipe)
    assert isinstance(tokenizer, FastTokenizer), why
    rows = samples()
    for sample in rows:
        text = render_prompt(sample.messages, tokenizer=tokenizer, template="auto")
        assert tokenizer(text)["input_ids"] == reference[sample.id], sample.id
    assert prompt_lengths(rows, tokenizer=tokenizer, template="auto") == [len(reference[s.id]) for s in rows]
    check = check_data(
        recipe, train={"sums": rows}, evals={"sums": rows}, reports={"sums": LoadReport(loaded=2)},
        eval_reports={"sums": LoadReport(loaded=2)}, tokenizer=tokenizer,
    )  # fmt: skip
    lengths = sorted(len(ids) for ids in reference.values())
    assert (check.fits["sums"].shortest, check.fits["sums"].longest) == (lengths[0], lengths[-1])
    assert check.longest_prompt == lengths[-1]  # what launch sizes the server's KV cache with
    assert check.examples["sums"].tokens == len(reference["plain"])  # plan's rendered prompt

    # The CLI end to end: a limit one below the longest prompt drops exactly that row.
    toml = tmp_path / "r.toml"
    toml.write_text(
        f'[model]\npath = "{smollm2_dir}"\n[data]\nmax_prompt_tokens = {lengths[-1] - 1}\n'
        f'[domains.sums]\ntags = ["sums"]\nfiles = ["{data}"]\nreward = "math_rule"\n'
    )
    from rlvr.cli import app

    result = CliRunner().invoke(app, ["validate", str(toml)])
    assert result.exit_code == 0, result.output
    assert (
        f"warning: domains.sums: 1 of 2 rows exceeds data.max_prompt_tokens = {lengths[-1] - 1} "
        f"(longest {lengths[-1]} tokens); it is skipped"
    ) in " ".join(result.stderr.split())


def test_rlvr_eval_sends_the_chat_template_ids(
    smollm2_dir: Path, reference: dict[str, list[int]], hf_tokenizer: Any, sent_prompts: list[list[int]]
) -> None:
    """`rlvr eval`'s `evaluate` on the real engine: the ids it sends, and the prompt its rows report."""
    from rlvr.evaluation import evaluate

    rows = samples()
    out = evaluate(smollm2_dir, rows, rewards={"sums": ("math_rule", {})}, max_new_tokens=2)
    assert sorted(sent_prompts) == sorted(reference.values())
    for row in out:
        assert hf_tokenizer(row.prompt, add_special_tokens=False)["input_ids"] == reference[row.sample.id]
        assert row.finish_reason in ("stop", "length")
