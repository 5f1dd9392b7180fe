"""Fixtures for tests against the real vLLM (CPU build): its env, and one server per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from .vllm_env import ensure_vllm, serving, vllm_recipe


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python, why = ensure_vllm()
    if python is None:
        pytest.skip(why)
    return python


@pytest.fixture(scope="session")
def vllm_server(vllm_python: Path, tmp_path_factory):
    """A vLLM server on the quickstart policy (a tied LM head: the CPU reload trap), 512-token context."""
    recipe = vllm_recipe(vllm_python, "rollout.vllm.max_model_len=512")
    with serving(recipe, log=tmp_path_factory.mktemp("vllm") / "server.log") as server:
        yield server
