"""`rlvr plan ... > plan.txt`: output that is not a terminal keeps every table cell whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_plan_into_a_file_does_not_truncate_cells(tmp_path: Path) -> None:
    out = tmp_path / "plan.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # as a CI job or a cron line
    recipe = ROOT / "recipes" / "math_code_judge.toml"
    command = [sys.executable, "-m", "rlvr.cli", "plan", str(recipe), "--out", str(tmp_path / "resolved.json")]
    with out.open("w") as handle:
        result = subprocess.run(command, stdout=handle, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "…" not in text, text
    assert "code_sandbox" in text and "quota steps 1-4" in text
    assert any(len(line) > 80 for line in text.splitlines())  # wider than the 80-column default


def test_quotas_shown_for_no_more_steps_than_the_run_has() -> None:
    from rich.console import Console

    from rlvr.monitor.plan_view import domain_table
    from rlvr.recipe.load import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", ["experiment.max_steps=3"])
    console = Console(record=True, width=300)
    console.print(domain_table(recipe, None))
    text = console.export_text()
    assert "quota steps 1-3" in text and "quota steps 1-4" not in text
    row = next(line for line in text.splitlines() if "math_rule" in line)
    assert len(next(cell for cell in row.split("│") if cell.count("/") >= 2).strip().split("/")) == 3


def test_plan_shows_each_domains_prompt_as_the_model_reads_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rlvr.cli import app

    result = CliRunner().invoke(
        app, ["plan", str(ROOT / "recipes" / "quickstart.toml"), "--out", str(tmp_path / "r.json")]
    )
    assert result.exit_code == 0, result.output
    text = result.stdout
    for domain, row, tokens in (("math", "math-0", 23), ("code", "code-0", 27), ("words", "words-0", 35)):
        assert f"prompt of domains.{domain}: row {row}, {tokens} tokens, as the model reads it" in text
    # the quickstart policy's template: "user: ...\nassistant: " (the newline and the final space shown)
    assert "user: 2+3=?↵" in text and "assistant:␠" in text
    assert text.index("Task mix") < text.index("prompt of domains.math") < text.index("Algorithm")


def test_a_long_prompt_keeps_its_start_and_its_end() -> None:
    from rich.console import Console

    from rlvr.data.prompt_fit import PromptExample
    from rlvr.monitor.plan_view import PROMPT_HEAD_CHARS, PROMPT_TAIL_CHARS, prompt_panel

    text = "<|im_start|>system\n" + "x" * 5000 + "<|im_end|>\n<|im_start|>assistant\n"
    console = Console(record=True, width=100)
    console.print(prompt_panel("math", PromptExample(row_id="r1", text=text, tokens=1234)))
    shown = console.export_text()
    cut = len(text) - PROMPT_HEAD_CHARS - PROMPT_TAIL_CHARS
    assert f"… {cut:,} characters cut …" in shown
    assert "<|im_start|>system↵" in shown and "<|im_start|>assistant↵" in shown
    assert "row r1, 1234 tokens" in shown


def test_plan_says_the_mix_is_adaptive_with_its_bounds_and_each_pool() -> None:
    from rich.console import Console

    from rlvr.monitor.plan_view import domain_table
    from rlvr.recipe.load import load_recipe

    overrides = ["data.mix=adaptive", "data.mix_floor=0.1", "domains.code.mix_ceiling=0.5",
                 "domains.math.pool={retire_after=3,revisit_rate=0.2}",
                 "domains.code.pool={retire_after=1,retire_failed_after=4,revisit_after=20}"]  # fmt: skip
    console = Console(record=True, width=300)
    console.print(domain_table(load_recipe(ROOT / "recipes" / "quickstart.toml", overrides), None))
    text = console.export_text()
    assert "mix adaptive" in text and "math 0.1-1, code 0.1-0.5, words 0.1-1" in text
    assert "pool math: a prompt all-correct or all-wrong 3x in a row rests, drawn at rate 0.2" in text
    assert "pool code: a prompt all-correct 1x or all-wrong 4x in a row rests, back after 20 steps" in text
    console = Console(record=True, width=300)
    console.print(domain_table(load_recipe(ROOT / "recipes" / "quickstart.toml", []), None))
    assert "mix adaptive" not in console.export_text()
