"""`rlvr serve MODEL_PATH`: the embedded engine behind SGLang's HTTP API and OpenAI's routes.

The one definition of the command: the CLI mounts this function as `rlvr serve`, and it also
runs standalone (`python -m rlvr.server.commands MODEL_PATH ...`) so tests need not depend
on the CLI's wiring. Nothing heavy is imported at module level (the CLI imports this at
parse time).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer


def serve(
    model_path: Annotated[
        Path, typer.Argument(help="A local HF model folder (config, tokenizer, safetensors).", show_default=False)
    ],
    host: Annotated[
        str, typer.Option(help="Interface to bind; 0.0.0.0 exposes the server to the network.", metavar="ADDR")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one (the bound port is printed).")] = 30000,
    api_key: Annotated[
        str | None,
        typer.Option(help="Require `Authorization: Bearer KEY` on every route but /health*.", metavar="KEY"),
    ] = None,
    max_batch: Annotated[int, typer.Option(help="Sequences decoded together (continuous batching cap).")] = 64,
    dtype: Annotated[
        str, typer.Option(help="float32 (fastest on CPU), bfloat16 or float16.", metavar="DTYPE")
    ] = "float32",
    device: Annotated[
        str | None, typer.Option(help="cpu or cuda[:i] (default: cuda when available).", metavar="DEVICE")
    ] = None,
    max_seq_len: Annotated[int, typer.Option(help="KV cache length per sequence (prompt + response).")] = 2048,
    kv_cache_gb: Annotated[
        float | None,
        typer.Option(help="Most GB the KV cache may take; fewer than --max-batch sequences if it must.", metavar="GB"),
    ] = None,
    weight_version: Annotated[
        str, typer.Option(help="Initial weight version reported in meta_info.", metavar="VERSION")
    ] = "0",
) -> None:
    """Serve a model on SGLang's HTTP routes and OpenAI's /v1 routes (the rollout and judge server).

    SGLang's /generate, /update_weights_*, /pause_generation, ...; OpenAI's /v1/chat/completions
    and /v1/completions (streaming and per-token logprobs).

    Example: rlvr serve recipes/quickstart/policy --port 0
    """
    if not (model_path / "config.json").exists():
        _fail(f"{model_path}: no model folder here (expected a HF folder with config.json)")
    from rlvr.server.embedded import DTYPES  # torch-free: the check stays instant

    if dtype not in DTYPES:
        _fail(f"--dtype {dtype}: expected {', '.join(DTYPES[:-1])} or {DTYPES[-1]}")
    for name, value in (("--max-batch", max_batch), ("--max-seq-len", max_seq_len)):
        if value < 1:
            _fail(f"{name} {value}: must be at least 1")
    if kv_cache_gb is not None and not kv_cache_gb > 0:
        _fail(f"--kv-cache-gb {kv_cache_gb}: must be a positive number of GB")
    from rlvr.server.routes import bind

    try:
        sock = bind(host, port)
    except OSError as exc:
        _fail(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); pick another or --port 0")
    bound = sock.getsockname()[1]
    typer.echo(f"rlvr serve: loading {model_path}; will listen on http://{host}:{bound}")
    from rlvr.server.embedded import EmbeddedEngine
    from rlvr.server.kv_cache import KVBudgetError
    from rlvr.server.routes import run_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_loading_bars()
    try:
        engine = EmbeddedEngine(
            model_path,
            max_batch=max_batch,
            dtype=dtype,
            device=device,
            max_seq_len=max_seq_len,
            weight_version=weight_version,
            kv_cache_bytes=None if kv_cache_gb is None else int(kv_cache_gb * 1e9),
        )
    except KVBudgetError as exc:
        _fail(f"--kv-cache-gb {kv_cache_gb}: {exc}")
        raise
    typer.echo(f"rlvr serve: ready on http://{host}:{bound} (OpenAI base_url http://{host}:{bound}/v1)")
    try:
        run_server(engine, sock=sock, api_key=api_key)
    finally:
        engine.close()


def _fail(message: str) -> None:
    """One line on stderr, exit 2 (the CLI's convention for input a user can fix)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def quiet_loading_bars() -> None:
    """transformers' per-tensor "Loading weights" bars fill a terminal or a log for nothing."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main() -> None:
    typer.run(serve)


if __name__ == "__main__":
    main()
