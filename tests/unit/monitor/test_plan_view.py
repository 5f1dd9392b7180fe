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
