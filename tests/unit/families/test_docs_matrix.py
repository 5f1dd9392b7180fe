"""docs/models.md shows the matrix as `rlvr.recipe.families.support_table()` renders it, so the page says
exactly what tests/unit/families and tests/vllm/test_families.py check (RLVR_UPDATE_DOCS=1 rewrites it)."""

from __future__ import annotations

from rlvr.recipe.families import support_table
from tests.unit.test_docs import ROOT, check_generated_section

BEGIN = "<!-- family matrix: generated from rlvr/recipe/families.py by tests/unit/families/test_docs_matrix.py -->"
END = "<!-- end of family matrix -->"


def test_the_page_shows_the_matrix_the_tests_check() -> None:
    check_generated_section(
        ROOT / "docs" / "models.md", BEGIN, END, "\n" + support_table(),
        differs="the family matrix differs from rlvr/recipe/families.py; rewrite it with RLVR_UPDATE_DOCS=1 pytest "
        "tests/unit/families",
    )  # fmt: skip
