"""`validate_recipe`, the one pipeline behind `rlvr validate`, `plan`, `launch` and `sbatch`: its
checks run in order up to the first error, which is the last line it returns."""

from __future__ import annotations

from pathlib import Path

from rlvr.validate import Problem, validate_recipe
from tests.unit.recipe.helpers import MINIMAL, write_recipe


def test_a_valid_recipe_has_no_error_and_its_data(tmp_path: Path) -> None:
    found = validate_recipe(write_recipe(tmp_path))
    assert found.error is None and all(p.level != "error" for p in found.problems)
    assert found.recipe is not None and set(found.recipe.domains) == {"math", "code"}
    assert found.data is not None and found.data.problem is None


def test_the_first_error_ends_the_checks(tmp_path: Path) -> None:
    """A bad reward is reported before the data, which is not read: its file is missing too."""
    path = write_recipe(tmp_path, MINIMAL.replace('reward = "code_sandbox"', 'reward = "code_sandbx"'))
    (tmp_path / "code.jsonl").write_text("")
    found = validate_recipe(path)
    assert found.problems[-1].level == "error" and found.data is None
    assert found.error == found.problems[-1].text
    assert found.error.startswith(f"{path}:21: domains.code.reward: unknown reward 'code_sandbx'")


def test_a_data_error_names_the_key_and_comes_after_the_recipe_checks(tmp_path: Path) -> None:
    path = write_recipe(tmp_path)
    (tmp_path / "code.jsonl").write_text("")
    found = validate_recipe(path)
    assert found.recipe is not None and found.data is None
    assert found.problems == [
        Problem(
            "error",
            f"{path}:20: domains.code.files: {tmp_path / 'code.jsonl'} has no rows; expected at least one prompt row "
            "to train on",
        )
    ]
