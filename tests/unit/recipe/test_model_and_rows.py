"""`rlvr validate` checks the model folder and counts prompt tokens before anything starts (issue 23).

Each bad case used to pass validate and then fail or train on nothing: a model folder without a
tokenizer (every prompt encodes to []), without weights, a tokenizer without an eos token, rows
whose prompts are all longer than `data.max_prompt_tokens` (dropped at rollout time without a
word), an empty data file (the trainer died 15 s in). Each is now one line naming the file, the
key and what is expected, exit 2. The model folder is a copy of the quickstart policy (a char-level
tokenizer: one token per character, so prompt lengths are easy to reason about).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from tests.unit.recipe.helpers import one_error_line

from .helpers import CODE_ROWS, MATH_ROWS, MINIMAL, write_recipe

ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "recipes" / "quickstart" / "policy"
runner = CliRunner()

# MINIMAL with the policy folder instead of model.config, and limits its 512 positions hold.
FOLDER = (
    MINIMAL.replace(
        "config = {{ hidden_size = 32 }}\n\n", 'path = "policy"\ndtype = "float32"\n'
    )  # a CPU recipe, same lines
    .replace("prompts_per_step = 4", "prompts_per_step = 4\nmax_prompt_tokens = 64")
    .replace("n = 2", "n = 2\nmax_new_tokens = 64")
)
EXPECTED_TOKENIZER = "tokenizer.json and tokenizer_config.json, or tokenizer.model, or vocab.json and merges.txt"
LONG = "x" * 100  # 100 tokens with the char tokenizer


@pytest.fixture(autouse=True)
def _machine(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))  # validate adds the recipe's folder for plug-ins
    monkeypatch.delenv("RLVR_PLUGIN_PATH", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def setup(tmp: Path, body: str = FOLDER, *, math_rows=MATH_ROWS, code_rows=CODE_ROWS, folder: str = "policy") -> Path:
    shutil.copytree(POLICY, tmp / folder, dirs_exist_ok=True)
    return write_recipe(tmp, body, math_rows=math_rows, code_rows=code_rows)


def validate(path: Path, *overrides: str):
    return runner.invoke(app, ["validate", str(path), *[arg for item in overrides for arg in ("--set", item)]])


def row(id_: str, prompt: str, *, tag: str = "math", system: str | None = None) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    fields = (
        {"ground_truth": "2"}
        if tag == "math"
        else {"case_type": "stdin_stdout", "test_cases": [{"input": "", "output": "1"}]}
    )
    return json.dumps({"id": id_, "tag": tag, "messages": messages, **fields})


def test_the_folder_recipe_is_valid(tmp_path: Path) -> None:
    result = validate(setup(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


# -- rows against data.max_prompt_tokens --------------------------------------------------------------


def test_rows_over_the_prompt_limit_are_counted_in_a_warning(tmp_path: Path) -> None:
    path = setup(tmp_path, math_rows=[*MATH_ROWS, row("long", LONG)])
    result = validate(path)
    assert result.exit_code == 0, result.output
    # "user: " + 100 x + "\nassistant: " with the quickstart chat template
    assert result.stderr.strip() == (
        "warning: domains.math: 1 of 4 rows exceeds data.max_prompt_tokens = 64 (longest 118 tokens); it is skipped"
    )
    assert "ok" in result.stdout


def test_several_rows_over_the_limit(tmp_path: Path) -> None:
    path = setup(tmp_path, math_rows=[MATH_ROWS[0], row("a", LONG), row("b", LONG + "yy")])
    result = validate(path)
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == (
        "warning: domains.math: 2 of 3 rows exceed data.max_prompt_tokens = 64 (longest 120 tokens); they are skipped"
    )


def test_a_domain_whose_rows_are_all_too_long(tmp_path: Path) -> None:
    path = setup(tmp_path, code_rows=[row("c1", LONG, tag="code"), row("c2", LONG + "y", tag="code")])
    line = one_error_line(validate(path))
    code = (tmp_path / "code.jsonl").resolve()
    assert line == (
        f"error: {path}:21: domains.code.files: none of the 2 rows of {code} fits data.max_prompt_tokens = 64: the "
        "shortest prompt is 118 tokens (chat template included); raise data.max_prompt_tokens or shorten the prompts"
    )


def test_the_system_message_counts_toward_the_limit(tmp_path: Path) -> None:
    """The prompt is what the model reads: a 40-character system message pushes a 25-token row over 64."""
    path = setup(tmp_path, code_rows=[row("c1", "print 1", tag="code", system="s" * 40)])
    line = one_error_line(validate(path))
    code = (tmp_path / "code.jsonl").resolve()
    assert line == (
        f"error: {path}:21: domains.code.files: the only row of {code} does not fit data.max_prompt_tokens = 64: its "
        "prompt is 74 tokens (chat template included); raise data.max_prompt_tokens or shorten the prompts"
    )


def test_tool_instructions_count_toward_the_limit(tmp_path: Path) -> None:
    """With tools listed in the prompt the same rows no longer fit: the count renders them as the rollout does."""
    body = FOLDER.replace('reward = "math_rule"', 'reward = "math_rule"\ntools = ["python"]')
    line = one_error_line(validate(setup(tmp_path, body)))
    math = (tmp_path / "math.jsonl").resolve()
    assert line.startswith(
        f"error: {tmp_path / 'recipe.toml'}:16: domains.math.files: none of the 3 rows of {math} fits"
    )
    assert "(chat template and tool instructions included)" in line
    assert validate(tmp_path / "recipe.toml", "domains.math.tool_instructions=false").exit_code == 0


def test_eval_rows_are_counted_too(tmp_path: Path) -> None:
    body = FOLDER.replace('reward = "math_rule"', 'reward = "math_rule"\neval_files = ["eval.jsonl"]')
    path = setup(tmp_path, body)
    (tmp_path / "eval.jsonl").write_text("\n".join([MATH_ROWS[0], row("e", LONG)]) + "\n")
    result = validate(path)
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == (
        "warning: domains.math.eval_files: 1 of 2 rows exceeds data.max_prompt_tokens = 64 (longest 118 tokens); "
        "it is not evaluated"
    )
    (tmp_path / "eval.jsonl").write_text(row("e", LONG) + "\n")
    line = one_error_line(validate(path))
    assert line.startswith(f"error: {path}:18: domains.math.eval_files: the only row of ")


def test_a_chat_template_that_refuses_a_row(tmp_path: Path) -> None:
    path = setup(tmp_path, math_rows=[*MATH_ROWS, row("sys", "2+2?", system="be brief")])
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )
    (tmp_path / "policy" / "chat_template.jinja").write_text(template)
    line = one_error_line(validate(path))
    assert line == (
        f"error: {path}:16: domains.math.files: row 'sys': the tokenizer's chat template fails on it: "
        "System role not supported"
    )


@pytest.mark.parametrize("key", ["files", "eval_files"])
def test_an_empty_data_file(tmp_path: Path, key: str) -> None:
    body = FOLDER.replace('reward = "math_rule"', 'reward = "math_rule"\neval_files = ["eval.jsonl"]')
    path = setup(tmp_path, body)
    (tmp_path / "eval.jsonl").write_text(MATH_ROWS[0] + "\n")
    empty = tmp_path / ("math.jsonl" if key == "files" else "eval.jsonl")
    empty.write_text("\n  \n")  # blank lines are not rows
    line = one_error_line(validate(path))
    purpose = "to train on" if key == "files" else "to evaluate"
    where = 16 if key == "files" else 18
    assert line == (
        f"error: {path}:{where}: domains.math.{key}: {empty.resolve()} has no rows; expected at least one prompt row "
        f"{purpose}"
    )


def test_an_empty_data_file_without_a_tokenizer(tmp_path: Path) -> None:
    """model.config recipes (no tokenizer, no count) still refuse an empty file."""
    path = write_recipe(tmp_path, MINIMAL, code_rows=[])
    (tmp_path / "code.jsonl").write_text("")
    line = one_error_line(validate(path))
    code = (tmp_path / "code.jsonl").resolve()
    assert (
        line
        == f"error: {path}:20: domains.code.files: {code} has no rows; expected at least one prompt row to train on"
    )


def test_a_domain_whose_rows_are_all_filtered_out(tmp_path: Path) -> None:
    body = FOLDER.replace('reward = "code_sandbox"', 'reward = "code_sandbox"\nfilter = {{ max_prompt_chars = 3 }}')
    line = one_error_line(validate(setup(tmp_path, body)))
    code = (tmp_path / "code.jsonl").resolve()
    assert line == (
        f"error: {tmp_path / 'recipe.toml'}:21: domains.code.files: no row of {code} is usable (1 row: 1 filtered out "
        "by domains.code.filter); expected at least one row to train on"
    )


def test_a_domain_whose_rows_are_all_bad_in_skip_mode(tmp_path: Path) -> None:
    path = setup(tmp_path, code_rows=["not json"])
    line = one_error_line(validate(path, "data.on_bad_row=skip"))
    code = (tmp_path / "code.jsonl").resolve()
    assert line == (
        f"error: {path}:21: domains.code.files: no row of {code} is usable (1 row: 1 bad (skipped by "
        f"data.on_bad_row = 'skip'; first: {code}:1: invalid JSON: Expecting value (column 1))); expected at least "
        "one row to train on"
    )


def test_plan_shows_the_count_in_the_domain_table(tmp_path: Path) -> None:
    path = setup(tmp_path, math_rows=[*MATH_ROWS, row("long", LONG)])
    result = runner.invoke(app, ["plan", str(path), "--out", str(tmp_path / "resolved.json")])
    assert result.exit_code == 0, result.output
    math = next(line for line in result.stdout.splitlines() if line.startswith("│ math "))
    cells = [cell.strip() for cell in math.strip("│").split("│")]
    assert cells[4:8] == ["4", "0", "1", "118"]  # rows, skipped, too long, longest
    assert "too long: prompts over data.max_prompt_tokens = 64 tokens (chat template included)" in result.stdout


def test_plan_says_when_it_could_not_count(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(write_recipe(tmp_path)), "--out", str(tmp_path / "resolved.json")])
    assert result.exit_code == 0, result.output
    assert "prompt tokens not counted: model.config builds the model without a tokenizer" in result.stdout


# -- the model folder -----------------------------------------------------------------------------------


def test_a_model_folder_without_a_tokenizer(tmp_path: Path) -> None:
    path = setup(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / "policy" / name).unlink()
    line = one_error_line(validate(path))
    assert line == (
        f"error: {path}:7: model.path: {tmp_path / 'policy'} has no tokenizer (expected {EXPECTED_TOKENIZER}); copy "
        "them from the base model, or set model.tokenizer to a folder that has them"
    )


def test_a_tokenizer_folder_without_a_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    body = FOLDER.replace('path = "policy"', f'path = "policy"\ntokenizer = "{tmp_path / "tok"}"')
    line = one_error_line(validate(setup(tmp_path, body)))
    recipe, tok = tmp_path / "recipe.toml", tmp_path / "tok"
    assert line == f"error: {recipe}:8: model.tokenizer: {tok} has no tokenizer (expected {EXPECTED_TOKENIZER})"


def test_a_tokenizer_that_encodes_text_to_nothing(tmp_path: Path) -> None:
    path = setup(tmp_path)
    tokenizer = json.loads((tmp_path / "policy" / "tokenizer.json").read_text())
    tokenizer["model"] = {"type": "BPE", "vocab": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}, "merges": []}
    (tmp_path / "policy" / "tokenizer.json").write_text(json.dumps(tokenizer))
    line = one_error_line(validate(path))
    assert line == (
        f"error: {path}:7: model.path: the tokenizer in {tmp_path / 'policy'} encodes text to no tokens ('The answer "
        "is 42.' gave []): its tokenizer.json has no vocabulary for it"
    )


def test_a_tokenizer_file_that_does_not_load(tmp_path: Path) -> None:
    path = setup(tmp_path)
    (tmp_path / "policy" / "tokenizer.json").write_text('{"model": {}}')
    line = one_error_line(validate(path))
    assert line.startswith(f"error: {path}:7: model.path: {tmp_path / 'policy' / 'tokenizer.json'} does not load: ")


def test_a_model_without_an_eos_token(tmp_path: Path) -> None:
    path = setup(tmp_path)
    for name, key in (
        ("tokenizer_config.json", "eos_token"),
        ("config.json", "eos_token_id"),
        ("generation_config.json", "eos_token_id"),
    ):
        file = tmp_path / "policy" / name
        file.write_text(json.dumps({k: v for k, v in json.loads(file.read_text()).items() if k != key}))
    line = one_error_line(validate(path))
    assert line == (
        f"error: {path}:7: model.path: the tokenizer in {tmp_path / 'policy'} has no eos token (expected eos_token in "
        "tokenizer_config.json, or eos_token_id in config.json or generation_config.json); a response would never end "
        "before max_new_tokens"
    )


def test_a_model_folder_without_weights(tmp_path: Path) -> None:
    path = setup(tmp_path)
    (tmp_path / "policy" / "model.safetensors").unlink()
    line = one_error_line(validate(path))
    assert line == (
        f"error: {path}:7: model.path: {tmp_path / 'policy'} has config.json but no weights (expected "
        "model.safetensors, model-*.safetensors shards with model.safetensors.index.json, or pytorch_model.bin)"
    )


def test_a_sharded_model_with_a_missing_shard(tmp_path: Path) -> None:
    path = setup(tmp_path)
    folder = tmp_path / "policy"
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    line = one_error_line(validate(path))
    assert line == (
        f"error: {path}:7: model.path: {folder / 'model.safetensors.index.json'} lists 2 weight file(s) and 1 are "
        "missing (first: model-00002-of-00002.safetensors); the download is incomplete"
    )


def test_a_judge_folder_without_a_tokenizer(tmp_path: Path) -> None:
    path = setup(tmp_path, FOLDER + '\n[judge]\nmodel = "judge"\n')
    shutil.copytree(POLICY, tmp_path / "judge")
    (tmp_path / "judge" / "tokenizer.json").unlink()
    (tmp_path / "judge" / "tokenizer_config.json").unlink()
    line = one_error_line(validate(path))
    assert (
        line == f"error: {path}:30: judge.model: {tmp_path / 'judge'} has no tokenizer (expected {EXPECTED_TOKENIZER})"
    )


# -- the model's context ------------------------------------------------------------------------------------


def test_prompt_and_response_beyond_the_models_context(tmp_path: Path) -> None:
    line = one_error_line(validate(setup(tmp_path), "rollout.max_new_tokens=500"))
    assert line == (
        "error: --set rollout.max_new_tokens: data.max_prompt_tokens + rollout.max_new_tokens = 64 + 500 = 564 tokens "
        "is more than the model's context (max_position_embeddings = 512); lower one of them"
    )


def test_a_tool_episode_beyond_the_models_context(tmp_path: Path) -> None:
    body = FOLDER.replace(
        'reward = "math_rule"',
        'reward = "math_rule"\ntools = ["python"]\ntool_instructions = false\nmax_episode_tokens = 480',
    )
    path = setup(tmp_path, body)
    line = one_error_line(validate(path))
    assert line == (
        f"error: {path}:20: domains.math.max_episode_tokens: data.max_prompt_tokens + domains.math.max_episode_tokens "
        "= 64 + 480 = 544 tokens is more than the model's context (max_position_embeddings = 512); lower one of them"
    )


def test_shipped_recipes_fit_their_models_context() -> None:
    from rlvr.recipe.load import load_recipe

    for name in ("quickstart.toml", "tools.toml"):
        load_recipe(ROOT / "recipes" / name)  # raises on a context overflow


def test_a_config_json_that_is_not_json(tmp_path: Path) -> None:
    path = setup(tmp_path)
    (tmp_path / "policy" / "config.json").write_text("{not json")
    line = one_error_line(validate(path))
    assert line == (
        f"error: {path}:7: model.path: {tmp_path / 'policy' / 'config.json'} is not a JSON config: Expecting property "
        "name enclosed in double quotes: line 1 column 2 (char 1)"
    )
