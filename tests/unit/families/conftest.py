"""One tiny model folder per family, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from .configs import build_folder


@pytest.fixture(scope="session")
def family_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("families")


@pytest.fixture
def family_dir(family_root: Path, family: str) -> Path:
    return build_folder(family, family_root)
