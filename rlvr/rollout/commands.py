"""`rlvr serve MODEL_PATH`: the embedded engine behind SGLang's HTTP API.

The CLI imports this module at parse time, so nothing heavy is imported at module level.
It also runs standalone (`python -m rlvr.rollout.commands MODEL_PATH ...`), which is
what the launcher and the tests start, so they need not depend on the CLI's wiring.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer


def serve(
    model_path: Annotated[Path, typer.Argument(help="A local HF model folder (config, tokenizer, safetensors).")],
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 exposes the server to the network.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port.")] = 30000,
    api_key: Annotated[
        str | None, typer.Option(help="Require `Authorization: Bearer KEY` on every route but /health*.")
    ] = None,
    max_batch: Annotated[int, typer.Option(help="Sequences decoded together (continuous batching cap).")] = 64,
    dtype: Annotated[str, typer.Option(help="float32 (fastest on CPU), bfloat16 or float16.")] = "float32",
    device: Annotated[str | None, typer.Option(help="cpu or cuda[:i] (default: cuda when available).")] = None,
    max_seq_len: Annotated[int, typer.Option(help="KV cache length per sequence (prompt + response).")] = 2048,
    weight_version: Annotated[str, typer.Option(help="Initial weight version reported in meta_info.")] = "0",
) -> None:
    """Serve a model with the embedded engine on SGLang's routes (/generate, /update_weights_*, ...)
    and OpenAI's /v1/chat/completions."""
    from rlvr.rollout.embedded import EmbeddedEngine
    from rlvr.rollout.server import run_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = EmbeddedEngine(
        model_path,
        max_batch=max_batch,
        dtype=dtype,
        device=device,
        max_seq_len=max_seq_len,
        weight_version=weight_version,
    )
    try:
        run_server(engine, host=host, port=port, api_key=api_key)
    finally:
        engine.close()


def main() -> None:
    typer.run(serve)


if __name__ == "__main__":
    main()
