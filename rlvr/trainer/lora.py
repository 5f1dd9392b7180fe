"""LoRA on the policy: peft's adapters injected into the transformers model, and the three views of it
that the rest of the trainer needs.

`apply_lora` injects peft's LoRA layers in place (`peft.inject_adapter_in_model`), so the model
keeps its transformers class, config and module paths: FSDP2 shards the same blocks, frozen base
weights beside the adapters, and only the adapters get gradients and optimizer states. Views:
`merged_sources` (plain transformers weights, so merged sync, disk sync and `rlvr export --merge`
need nothing of their own), `adapter_sources` / `write_adapter` (the adapters in peft's format:
what `sync.lora = "adapter"` pushes and `rlvr export` writes) and `adapters_disabled` (the base
model, the KL reference, from the same parameters: one model, not two). docs/lora.md.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Generator, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import nn

from rlvr.recipe.schema import LoraConfig
from rlvr.trainer import dist as d
from rlvr.trainer.typed_torch import manual_seed, named_modules

if TYPE_CHECKING:
    from peft import LoraConfig as PeftLoraConfig

ADAPTER = "default"  # peft's adapter name: the only one rlvr trains
PEFT_PREFIX = "base_model.model."  # peft's key prefix in adapter files (PeftModel wraps the model twice)
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"

# (HF name, local or sharded tensor, layout change of the full tensor or None): `weights.Source`
_Source = tuple[str, torch.Tensor, Callable[[torch.Tensor], torch.Tensor] | None]


class _SafetensorsTorch(Protocol):
    """`safetensors.torch` as rlvr calls it (its path parameter leaves a type unknown)."""

    def save_file(self, tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str]) -> None: ...


def apply_lora(model: nn.Module, cfg: LoraConfig, *, seed: int) -> nn.Module:
    """Inject LoRA layers (A random, B zero: the model starts as the base) and freeze the rest.

    `seed` makes every rank initialise the same A. The model's `rlvr_lora` attribute holds the
    peft config, with `target_modules` resolved to the names peft matched."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    targets: str | list[str] = cfg.target_modules if cfg.target_modules == "all-linear" else list(cfg.target_modules)
    peft_cfg = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # pyright: ignore[reportArgumentType] - peft annotates int, computes in float
        lora_dropout=cfg.dropout,
        target_modules=targets,
        bias="none",
    )
    manual_seed(seed)
    try:
        model = inject_adapter_in_model(peft_cfg, model)
    except ValueError as exc:
        raise ValueError(f"trainer.lora.target_modules: {exc}") from None
    modules = lora_modules(model)
    if not modules:
        raise ValueError(f"trainer.lora.target_modules: {cfg.target_modules!r} matched no linear layer of the model")
    peft_cfg.target_modules = sorted({name.rsplit(".", 1)[-1] for name in modules})
    peft_cfg.base_model_name_or_path = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    setattr(model, "rlvr_lora", peft_cfg)  # noqa: B010 - a plain attribute beside the modules
    return model


def is_lora(model: nn.Module) -> bool:
    return lora_rank(model) > 0


def lora_rank(model: nn.Module) -> int:
    """The adapters' rank r, 0 for a model without LoRA (the one place that reads the marker)."""
    cfg: PeftLoraConfig | None = getattr(model, "rlvr_lora", None)
    return int(cfg.r) if cfg is not None else 0


def lora_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Module path -> peft LoRA layer, in module order."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in named_modules(model) if isinstance(module, LoraLayer)}


@contextmanager
def adapters_disabled(model: nn.Module) -> Generator[None]:
    """The base model's forward (the KL reference): every LoRA layer skips its adapter.

    Sets peft's per-layer flag directly: peft's `enable_adapters(False)` also flips the adapters'
    `requires_grad`, which would change what FSDP2 and the optimizer see between steps."""
    layers: list[Any] = list(lora_modules(model).values())
    for layer in layers:
        layer._disable_adapters = True  # noqa: SLF001
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False  # noqa: SLF001


def _lora_pair(model: nn.Module, path: str) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(A, B, scaling) of the LoRA layer at `path`, None when it is not one."""
    try:
        module: Any = model.get_submodule(path)
    except AttributeError:
        return None
    lora_a = getattr(module, "lora_A", None)
    if lora_a is None or ADAPTER not in lora_a:
        return None
    return lora_a[ADAPTER].weight, module.lora_B[ADAPTER].weight, float(module.scaling[ADAPTER])


def merged_sources(model: nn.Module, *, skip_tied: bool = True) -> list[_Source]:
    """`weight_sources` of a LoRA model: transformers names and shapes; a base weight with an adapter
    is merged (W + scaling * B @ A, in fp32) by its layout function, which gathers A and B (collective
    under FSDP2, in the same lockstep as the weight itself); the adapters are not listed."""
    seen: set[int] = set()
    out: list[_Source] = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if ".lora_" in name:
            continue
        if skip_tied:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
        layout = None
        if ".base_layer." in name:
            path, leaf = name.rsplit(".base_layer.", 1)
            name = f"{path}.{leaf}"
            pair = _lora_pair(model, path) if leaf == "weight" else None
            if pair is not None:
                layout = _merge(*pair, gather=d.full_tensor)
        out.append((name, tensor, layout))
    return out


def _merge(
    a: torch.Tensor, b: torch.Tensor, scaling: float, *, gather: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[torch.Tensor], torch.Tensor]:
    def layout(w: torch.Tensor) -> torch.Tensor:
        delta = gather(b).detach().float() @ gather(a).detach().float()
        return (w.float() + scaling * delta).to(w.dtype)

    return layout


def adapter_sources(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(peft file key, local or sharded tensor) of every adapter weight, in module order."""
    out: list[tuple[str, torch.Tensor]] = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        for kind in ("lora_A", "lora_B"):
            marker = f".{kind}.{ADAPTER}."
            if marker in name:
                out.append((PEFT_PREFIX + name.replace(marker, f".{kind}."), tensor))
    return out


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full adapter tensors (fp32, CPU) under peft's keys. Collective under FSDP2."""
    return {key: d.full_tensor(t).detach().float().cpu().contiguous() for key, t in adapter_sources(model)}


def write_adapter(model: nn.Module, out_dir: str | Path) -> Path | None:
    """Write a peft adapter folder (adapter_model.safetensors + adapter_config.json), atomically
    (`<out>.tmp`, then renamed). Collective: every rank gathers; rank 0 writes and gets the folder."""
    import safetensors.torch

    state = adapter_state(model)
    if d.rank() != 0:
        return None
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    cast(_SafetensorsTorch, safetensors.torch).save_file(state, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(model), indent=2, sort_keys=True))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def adapter_config(model: nn.Module) -> dict[str, Any]:
    """peft's adapter_config.json of the model's adapters (target_modules resolved to names)."""
    cfg: PeftLoraConfig | None = getattr(model, "rlvr_lora", None)
    assert cfg is not None, "not a LoRA model"
    raw = cast("dict[str, object]", cfg.to_dict())  # peft annotates a bare dict
    raw["target_modules"] = sorted(cast("Iterable[str]", raw["target_modules"]))  # module names (apply_lora)
    raw["peft_type"] = "LORA"
    raw.setdefault("task_type", None)
    return json.loads(json.dumps(raw, default=_jsonable))


def _jsonable(value: object) -> list[str] | str:
    if isinstance(value, (set, frozenset)):
        return sorted(cast("set[str] | frozenset[str]", value))  # peft's sets of module names
    return str(value)
