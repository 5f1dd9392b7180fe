"""Property test: random mutations of a valid recipe never escape as anything but RecipeError."""

from __future__ import annotations

import tomllib
from pathlib import Path

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlvr.recipe.load import RecipeError, load_recipe

from .helpers import MINIMAL, write_recipe

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(min_size=1, max_size=5), st.integers(), max_size=2),
)


def paths(tree: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for key, value in tree.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out.extend(paths(value, (*prefix, key)))
    return out


def to_toml_value(value):
    if value is None:
        return "none"
    return value


@settings(
    max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_mutated_recipes_fail_cleanly(tmp_path: Path, data) -> None:
    base = write_recipe(tmp_path)
    tree = tomllib.loads(base.read_text())
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        all_paths = paths(tree)
        target = data.draw(st.sampled_from(all_paths))
        parent = tree
        for part in target[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["delete", "replace", "add"]))
        if action == "delete":
            parent.pop(target[-1], None)
        elif action == "replace":
            parent[target[-1]] = to_toml_value(data.draw(VALUES))
        else:
            parent[data.draw(st.text(min_size=1, max_size=6))] = to_toml_value(data.draw(VALUES))
    path = tmp_path / "mutated.toml"
    path.write_text(tomli_w.dumps(tree))
    try:
        load_recipe(path)
    except RecipeError as exc:
        message = str(exc)
        assert message and "\n" not in message, message


def test_minimal_recipe_is_valid(tmp_path: Path) -> None:
    load_recipe(write_recipe(tmp_path, MINIMAL))
