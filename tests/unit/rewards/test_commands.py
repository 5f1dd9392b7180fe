from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from rlvr.rewards.commands import app

runner = CliRunner()


def write_rows(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_list_shows_builtins():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    for name in ("math_rule", "code_sandbox", "llm_judge"):
        assert name in result.output


def test_check_scores_rows(tmp_path):
    rows = write_rows(
        tmp_path / "rows.jsonl",
        [
            {"id": "a", "tag": "m", "prompt": "1/2?", "ground_truth": "0.5", "completion": "\\boxed{\\frac12}"},
            {
                "id": "b",
                "tag": "m",
                "messages": [{"role": "user", "content": "q"}],
                "ground_truth": "3",
                "completion": "it is 4",
            },
        ],
    )
    result = runner.invoke(app, ["check", str(rows), "--reward", "math_rule", "--args", '{"timeout_s": 20}'])
    assert result.exit_code == 0, result.output
    assert "1.000" in result.output and "0.000" in result.output and "not equivalent" in result.output
    assert "2 rows, mean score 0.500" in result.output


def test_check_bad_row_is_one_line_exit_2(tmp_path):
    rows = write_rows(tmp_path / "bad.jsonl", [{"id": "a", "prompt": "q", "completion": "x"}, "{not json"])
    result = runner.invoke(app, ["check", str(rows), "--reward", "math_rule"])
    assert result.exit_code == 2
    assert f"{rows}:2:" in result.output and "Traceback" not in result.output
    missing = write_rows(tmp_path / "missing.jsonl", [{"id": "a", "prompt": "q"}])
    result = runner.invoke(app, ["check", str(missing), "--reward", "math_rule"])
    assert result.exit_code == 2 and "missing 'completion'" in result.output


def test_check_unknown_reward_and_bad_args(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "q", "completion": "x"}])
    result = runner.invoke(app, ["check", str(rows), "--reward", "nope"])
    assert result.exit_code == 2 and "known rewards" in result.output
    result = runner.invoke(app, ["check", str(rows), "--reward", "math_rule", "--args", "[1]"])
    assert result.exit_code == 2 and "JSON object" in result.output


def test_check_rejects_a_misspelt_argument_as_validate_does(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "1?", "ground_truth": "1", "completion": "1"}])
    result = runner.invoke(app, ["check", str(rows), "--reward", "math_rule", "--args", '{"timout_s": 20}'])
    assert result.exit_code == 2
    assert "--args: math_rule does not take 'timout_s' (did you mean 'timeout_s'?)" in result.output
    result = runner.invoke(app, ["check", str(rows), "--reward", "math_rule", "--args", '{"format_weight": 1.5}'])
    assert result.exit_code == 2 and "format_weight: expected a number in [0, 1], got 1.5" in result.output


@pytest.fixture
def plugin_rewards(tmp_path, monkeypatch):
    (tmp_path / "check_rewards.py").write_text(
        "def raises(sample, completion):\n"
        "    raise RuntimeError('reward backend unavailable')\n\n"
        "def text(sample, completion):\n"
        "    return 'yes'\n\n"
        "def zero(sample, completion):\n"
        "    return 0.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "check_rewards"
    sys.modules.pop("check_rewards", None)


def test_check_exits_1_when_every_row_raised(tmp_path, plugin_rewards):
    rows = write_rows(tmp_path / "rows.jsonl", [{"id": i, "prompt": "q", "completion": "x"} for i in "ab"])
    result = runner.invoke(app, ["check", str(rows), "--reward", f"{plugin_rewards}:raises"])
    assert result.exit_code == 1, result.output
    assert "2 rows, none judged, 2 failed" in result.stdout
    assert result.stderr.strip() == (
        "error: the reward failed on 2 of 2 rows (a run would not train on them); "
        f"first: {rows}:1: RuntimeError: reward backend unavailable"
    )


def test_check_exits_1_when_a_row_scores_no_number(tmp_path, plugin_rewards):
    rows = write_rows(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "q", "completion": "x"}])
    result = runner.invoke(app, ["check", str(rows), "--reward", f"{plugin_rewards}:text"])
    assert result.exit_code == 1, result.output
    assert "failed" in result.stdout and "reward returned str" in result.stderr


def test_check_a_row_that_scores_0_is_not_an_error(tmp_path, plugin_rewards):
    rows = write_rows(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "q", "completion": "x"}])
    result = runner.invoke(app, ["check", str(rows), "--reward", f"{plugin_rewards}:zero"])
    assert result.exit_code == 0, result.output
    assert "1 rows, mean score 0.000, 0 at 1.0, 0 failed" in result.stdout


def test_check_code_rows_whose_test_cases_do_not_fit(tmp_path):
    good = {"id": "a", "prompt": "f", "case_type": "assert", "test_cases": ["assert f(1) == 2"], "completion": "x"}
    rows = write_rows(tmp_path / "rows.jsonl", [good, {**good, "test_cases": {"f(1)": 2}}])
    result = runner.invoke(app, ["check", str(rows), "--reward", "code_sandbox"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {rows}:2: test_cases for case_type 'assert' must be a string or a non-empty list of strings (got dict)"
    )


def test_check_reads_a_rows_finish_reason():
    """`rlvr eval --out` writes finish_reason; "length" tells a reward the response was cut."""
    from rlvr.rewards.commands import RowError, row_to_sample

    _, cut = row_to_sample({"prompt": "p", "completion": "```python\ndef f(", "finish_reason": "length"})
    assert cut.finish_reason == "length"
    sample, plain = row_to_sample({"prompt": "p", "completion": "x", "finish_reason": ""})
    assert plain.finish_reason == "stop" and "finish_reason" not in sample.extra
    with pytest.raises(RowError, match="finish_reason"):
        row_to_sample({"prompt": "p", "completion": "x", "finish_reason": "eos"})


def test_check_reads_a_tool_episodes_own_text_as_the_run_did(tmp_path):
    """A samples.jsonl row of a tool episode carries `own_text`: the tool's printed 42 is not the answer."""
    episode = "```python\nprint(6*7)\n```\n<result>\n42\n</result>\nThe answer is \\xe."
    row = {"id": "a", "tag": "m", "prompt": "6*7?", "ground_truth": "42", "completion": episode}
    rows = write_rows(tmp_path / "rows.jsonl", [row | {"own_text": "```python\nprint(6*7)\n```\nThe answer is \\xe."}])
    result = runner.invoke(app, ["check", str(rows), "--reward", "math_rule"])
    assert result.exit_code == 0 and "1 rows, mean score 0.000" in result.output, result.output
    write_rows(tmp_path / "rows.jsonl", [row])  # written before own_text: the whole episode, as then
    result = runner.invoke(app, ["check", str(rows), "--reward", "math_rule"])
    assert result.exit_code == 0 and "1 rows, mean score 1.000" in result.output, result.output
