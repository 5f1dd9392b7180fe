"""Tool keys in a recipe: `rlvr validate` rejects a bad tool in one line (exit 2), `rlvr plan` shows them."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from tests.unit.recipe.helpers import MINIMAL, write_recipe

runner = CliRunner()
TOOLS = """
tools = {tools}
tool_format = "hermes"
max_turns = 3
max_tool_calls = 2
tool_timeout_s = 4
max_episode_tokens = 300
search_corpus = "{corpus}"
search_top_k = 2
"""


def _recipe(tmp_path: Path, tools: str, corpus: str = "corpus.jsonl") -> Path:
    (tmp_path / "corpus.jsonl").write_text('{"title": "A", "text": "alpha beta"}\n')
    body = MINIMAL.replace(
        'reward = "math_rule"\n', 'reward = "math_rule"\n' + TOOLS.format(tools=tools, corpus=corpus)
    )
    return write_recipe(tmp_path, body)


def test_a_recipe_with_tools_validates_and_plans(tmp_path: Path) -> None:
    path = _recipe(tmp_path, '["python", "search", "tests.unit.tools.plugin_example:lookup_price"]')
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["plan", str(path), "--out", str(tmp_path / "r.json")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "Tools (multi-turn episodes)" in out and "hermes" in out and "300" in out
    assert "(top 2)" in out


@pytest.mark.parametrize(
    ("tools", "corpus", "expected"),
    [
        ('["python", "calculator"]', "corpus.jsonl", "domains.math.tools: unknown tool 'calculator'"),
        ('["nope_pkg.mod:fn"]', "corpus.jsonl", "domains.math.tools: tool plug-in 'nope_pkg.mod:fn': cannot import"),
        ('["search"]', "missing.jsonl", "domains.math.search_corpus: no such corpus file"),
    ],
)
def test_a_bad_tool_is_one_line_and_exit_2(tmp_path: Path, tools: str, corpus: str, expected: str) -> None:
    result = runner.invoke(app, ["validate", str(_recipe(tmp_path, tools, corpus))])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert expected in message, message
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


def test_tool_format_and_limits_are_checked(tmp_path: Path) -> None:
    path = _recipe(tmp_path, '["python"]')
    result = runner.invoke(app, ["validate", str(path), "--set", "domains.math.tool_format=xml"])
    assert result.exit_code == 2 and "domains.math.tool_format" in result.stderr
    result = runner.invoke(app, ["validate", str(path), "--set", "domains.math.max_turns=0"])
    assert result.exit_code == 2 and "domains.math.max_turns" in result.stderr
