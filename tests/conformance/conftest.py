"""The `sglang_site` fixture: SGLang's wheel in a cache folder, or a skip that says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from .sglang_env import ensure_sglang


@pytest.fixture(scope="session")
def sglang_site() -> Path:
    site, why = ensure_sglang()
    if site is None:
        pytest.skip(why)
    return site
