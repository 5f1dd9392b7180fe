"""`rollout.vllm.python = "auto"` finds the env `scripts/install-vllm.sh` built at its default folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.recipe.load import load_recipe
from rlvr.recipe.vllm_python import MARKER, VLLM_VERSION, resolve_vllm_python

QUICKSTART = Path(__file__).resolve().parents[3] / "recipes" / "quickstart.toml"


def built_env(cache: Path, name: str, *, done: bool = True) -> Path:
    python = cache / name / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    if done:
        (cache / name / MARKER).write_text(f"vllm {VLLM_VERSION} cpu\n")
    return python


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return tmp_path


def test_auto_is_the_default_env_once_the_script_finished_it(cache: Path) -> None:
    assert resolve_vllm_python("auto", gpus=0) == "python"  # nothing built: the probe says how to build it
    unfinished = built_env(cache, f"vllm-cpu-{VLLM_VERSION}", done=False)
    assert resolve_vllm_python("auto", gpus=0) == "python"
    (unfinished.parents[1] / MARKER).write_text("done\n")
    assert resolve_vllm_python("auto", gpus=0) == str(unfinished)
    assert resolve_vllm_python("/opt/vllm/bin/python", gpus=0) == "/opt/vllm/bin/python"


def test_a_gpu_machine_prefers_the_cuda_build(cache: Path) -> None:
    cpu = built_env(cache, f"vllm-cpu-{VLLM_VERSION}")
    gpu = built_env(cache, f"vllm-{VLLM_VERSION}")
    assert resolve_vllm_python("auto", gpus=0) == str(cpu)
    assert resolve_vllm_python("auto", gpus=2) == str(gpu)


def test_the_resolved_recipe_holds_the_env_every_process_uses(cache: Path) -> None:
    python = built_env(cache, f"vllm-cpu-{VLLM_VERSION}")
    assert load_recipe(QUICKSTART, ["rollout.engine=vllm"]).rollout.vllm.python == str(python)
    assert load_recipe(QUICKSTART).rollout.vllm.python == "auto"  # untouched when vLLM is not the engine
