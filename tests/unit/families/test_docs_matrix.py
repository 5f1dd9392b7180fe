"""docs/models.md shows the matrix as `rlvr.recipe.families.support_table()` renders it, so the page says
exactly what tests/unit/families and tests/vllm/test_families.py check (RLVR_UPDATE_DOCS=1 rewrites it)."""

from __future__ import annotations

import os
from pathlib import Path

from rlvr.recipe.families import support_table

PAGE = Path(__file__).resolve().parents[3] / "docs" / "models.md"
BEGIN = "<!-- family matrix: generated from rlvr/recipe/families.py by tests/unit/families/test_docs_matrix.py -->"
END = "<!-- end of family matrix -->"


def test_the_page_shows_the_matrix_the_tests_check() -> None:
    text = PAGE.read_text()
    assert BEGIN in text and END in text, "docs/models.md lost its family matrix markers"
    head, rest = text.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    wanted = "\n" + support_table()
    if os.environ.get("RLVR_UPDATE_DOCS") == "1" and current != wanted:
        PAGE.write_text(head + BEGIN + wanted + END + tail)
        current = wanted
    assert current == wanted, "docs/models.md's matrix differs: RLVR_UPDATE_DOCS=1 pytest tests/unit/families"
