"""Shared fixtures: a tiny model folder built once per session (nothing is downloaded)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# CI runs every property test with fixed seeds: a red CI must mean a change broke something,
# not that a new random example turned up (run locally without CI=1 to keep exploring).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rlvr.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def build_embedded_server_command(
    cfg: Any,
    *,
    model_path: str,
    port: int,
    host: str = "127.0.0.1",
    python: str | None = None,
    api_key: str | None = None,
    dtype: str = "float32",
    device: str | None = None,
    max_seq_len: int | None = None,
) -> list[str]:
    """argv for `rlvr serve` (as `python -m rlvr.rollout.commands`, independent of the CLI's wiring).

    Test-only: the launchers build their server commands in `rlvr.launch.commands`. `cfg` is a
    `RolloutConfig` (its `max_batch`).
    """
    argv = [
        python or sys.executable,
        "-m",
        "rlvr.rollout.commands",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--max-batch",
        str(cfg.max_batch),
        "--dtype",
        dtype,
    ]
    if api_key:
        argv += ["--api-key", api_key]
    if device:
        argv += ["--device", device]
    if max_seq_len:
        argv += ["--max-seq-len", str(max_seq_len)]
    return argv
