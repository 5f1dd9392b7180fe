"""A peft LoRA adapter merged into the base weights: what an engine loads for an adapter push.

With `sync.lora = "adapter"` the trainer pushes only a peft adapter folder, and every engine serves
W = W_base + (lora_alpha / r) * B @ A for each module it targets: only the adapter's bytes cross
the wire, decode runs at the base model's speed, and a partial rollout switches weights as after a
full push. W_base is read one tensor at a time from the folder the engine started on (the base is
frozen), so no second copy is kept. Each load replaces the previous adapter (`previous`: modules it
merged and this one does not go back to the base). The folder is checked against the base's
safetensors headers before a tensor is read; peft options that change the merge rule are refused.
For vLLM the merge also yields the untouched tensors of each touched fused layer (`siblings`). It
runs inside vLLM's Python too, so it imports only torch, safetensors and the standard library.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<half>[AB])\.weight$")

# adapter_config.json keys whose non-default values change what merging means (key -> the value it must have).
UNSUPPORTED = {
    "use_dora": False,
    "fan_in_fan_out": False,
    "lora_bias": False,
    "bias": "none",
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "trainable_token_indices": None,
    "target_parameters": None,
}


class AdapterError(ValueError):
    """An adapter folder that cannot be merged into the base (one line: the file, the key, what is expected)."""


@dataclass(frozen=True, slots=True)
class LoraTarget:
    """One merged weight: its HF name, its two adapter keys and its [out, in] shape."""

    weight: str
    a_key: str
    b_key: str
    shape: tuple[int, int]


@dataclass(frozen=True, slots=True)
class BaseTensor:
    """Where one base weight lies: its file and shape (from the safetensors header)."""

    file: Path
    shape: tuple[int, ...]


def _where(path: Path) -> str:
    """ "adapter_model.safetensors in /runs/x/adapters/v3": the file's name survives servers that
    blank paths out of error messages (vLLM's reads "... in <path>"), and the caller knows the folder."""
    return f"{path.name} in {path.parent}"


def read_config(folder: Path) -> tuple[int, float, float]:
    """(r, lora_alpha, scale) of an adapter folder's `adapter_config.json`, checked."""
    path = folder / ADAPTER_CONFIG
    where = _where(path)
    if not path.is_file():
        raise AdapterError(f"{where}: missing (a peft adapter folder holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{where}: not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{where}: expected a JSON object (peft's LoraConfig)")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise AdapterError(f"{where}: peft_type is {peft_type!r}, expected 'LORA'")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise AdapterError(f"{where}: r must be an integer >= 1, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise AdapterError(f"{where}: lora_alpha must be a number, got {alpha!r}")
    for key, expected in UNSUPPORTED.items():
        value = config.get(key, expected)
        unset = expected in (None, {}, False) and value in (None, {}, [], False)
        if value != expected and not unset:
            raise AdapterError(f"{where}: {key} = {value!r} is not supported (expected {expected!r})")
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    return r, float(alpha), scale


def base_index(base: str | Path) -> dict[str, BaseTensor]:
    """Every tensor of a HF safetensors folder: name -> (file, shape), from the headers only."""
    from safetensors import safe_open

    files = sorted(Path(base).glob("*.safetensors"))
    if not files:
        raise AdapterError(f"{base}: no *.safetensors files (the base model folder the engine was started on)")
    index: dict[str, BaseTensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                index[name] = BaseTensor(file, tuple(f.get_slice(name).get_shape()))
    return index


def read_targets(folder: Path, *, r: int, base: Mapping[str, BaseTensor]) -> dict[str, LoraTarget]:
    """The weights an adapter file merges into, checked against its config's `r` and the base's shapes."""
    from safetensors import safe_open

    path = folder / ADAPTER_WEIGHTS
    where = _where(path)
    if not path.is_file():
        raise AdapterError(f"{where}: missing (a peft adapter folder holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    halves: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                match = KEY.match(key)
                if match is None:
                    raise AdapterError(
                        f"{where}: key {key!r} is not a LoRA linear weight "
                        "(expected base_model.model.<module>.lora_A.weight or .lora_B.weight)"
                    )
                shape = tuple(f.get_slice(key).get_shape())
                halves.setdefault(match["module"], {})[match["half"]] = (key, shape)
    except AdapterError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors' own errors name no file
        raise AdapterError(f"{where}: not a readable safetensors file: {exc}") from exc
    if not halves:
        raise AdapterError(f"{where}: holds no LoRA weights")
    targets: dict[str, LoraTarget] = {}
    for module, pair in sorted(halves.items()):
        missing = [f"lora_{h}" for h in "AB" if h not in pair]
        if missing:
            raise AdapterError(
                f"{where}: base_model.model.{module}.{missing[0]}.weight is missing (lora_A and lora_B come in pairs)"
            )
        (a_key, a_shape), (b_key, b_shape) = pair["A"], pair["B"]
        weight = f"{module}.weight"
        found = base.get(weight)
        if found is None:
            raise AdapterError(f"{where}: {a_key} targets {weight}, which the base model's files do not hold")
        if len(found.shape) != 2:
            raise AdapterError(f"{where}: {a_key} targets {weight}, which is {list(found.shape)}, not a linear weight")
        out, inp = found.shape
        # Short enough to survive servers that cut error bodies (the key, both shapes, the base's).
        for key, shape, expected in ((a_key, a_shape, (r, inp)), (b_key, b_shape, (out, r))):
            if shape != expected:
                raise AdapterError(
                    f"{where}: {key} has shape {list(shape)}, expected {list(expected)} "
                    f"(r = {r}, the base weight is {list(found.shape)})"
                )
        targets[weight] = LoraTarget(weight, a_key, b_key, (out, inp))
    return targets


def _module_of(weight: str) -> str:
    return weight.rsplit(".", 1)[0]


def siblings(
    modules: Collection[str], base: Mapping[str, BaseTensor], packed_modules: Mapping[str, Sequence[str]]
) -> set[str]:
    """Every base tensor of the layers vLLM rebuilds when `modules` change: each module's own
    tensors (weight, bias) and those of the other members of its fused layer
    (`packed_modules`: vLLM's `packed_modules_mapping`, e.g. qkv_proj -> q/k/v_proj)."""
    members: set[str] = set()
    for module in modules:
        parent, _, leaf = module.rpartition(".")
        group = next((g for g in packed_modules.values() if leaf in g), [leaf])
        members.update(f"{parent}.{m}" if parent else m for m in group)
    return {name for name in base if _module_of(name) in members}


def _load_order(name: str, packed_modules: Mapping[str, Sequence[str]]) -> tuple[str, str]:
    """Sort key that keeps the members of one fused layer adjacent, so vLLM rebuilds a layer
    as soon as its tensors arrived instead of buffering several half-loaded layers."""
    module, _, param = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    fused = next((f for f, g in packed_modules.items() if leaf in g), leaf)
    return (f"{parent}.{fused}.{param}", name)


class AdapterMerge:
    """One adapter folder checked against a base folder, and the weights an engine loads for it.

    `previous`: the weights the engine's last adapter merged (its `merged`); those this adapter
    does not target are yielded as the base's (`restored`). `packed_modules`: vLLM's fused
    layers (see the module docstring); None (the embedded engine) yields no siblings.
    Construction checks everything and reads no tensor; `tensors` does the reading and merging.
    """

    def __init__(
        self,
        adapter: str | Path,
        base: str | Path,
        *,
        previous: Collection[str] = (),
        packed_modules: Mapping[str, Sequence[str]] | None = None,
    ):
        self.folder = Path(adapter)
        if not self.folder.is_dir():
            raise AdapterError(f"{self.folder}: not a folder (expected a peft adapter folder)")
        self.r, self.alpha, self.scale = read_config(self.folder)
        self.base = base_index(base)
        self.targets = read_targets(self.folder, r=self.r, base=self.base)
        self.merged = frozenset(self.targets)
        self.restored = frozenset(name for name in previous if name not in self.targets and name in self.base)
        touched = {_module_of(name) for name in self.merged | self.restored}
        extra = siblings(touched, self.base, packed_modules) if packed_modules is not None else set()
        self.siblings = frozenset(extra - self.merged - self.restored)
        order = packed_modules or {}
        self.names = sorted(self.merged | self.restored | self.siblings, key=lambda n: _load_order(n, order))
        self.fingerprint: dict[str, tuple[int, int, int, int]] = {}  # peft key -> checksum, of what `tensors` merged

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of everything `tensors` yields, in its order."""
        return {name: self.base[name].shape for name in self.names}

    def tensors(self, *, dtype: Any = None, device: Any = "cpu") -> Iterator[tuple[str, Any]]:
        """(HF weight name, tensor) for every weight to load, in `names` order: targeted ones
        W_base + (B @ A) * scale computed in fp32 (peft's `merge_and_unload` rule and order of
        operations), the rest the base's; each cast to `dtype` (None: as stored)."""
        import torch
        from safetensors import safe_open
        from safetensors.torch import load_file

        from rlvr.sync.fingerprint import fingerprint

        device = torch.device(device)
        lora = load_file(str(self.folder / ADAPTER_WEIGHTS), device=str(device))  # small: r x (in + out) each
        used = [key for target in self.targets.values() for key in (target.a_key, target.b_key)]
        self.fingerprint = fingerprint((key, lora[key]) for key in used)
        by_file: dict[Path, list[str]] = {}
        for name in self.names:
            by_file.setdefault(self.base[name].file, []).append(name)
        opened: dict[Path, Any] = {}
        with contextlib.ExitStack() as stack, _full_fp32_matmul(device):
            for file in by_file:
                opened[file] = stack.enter_context(safe_open(str(file), framework="pt", device=str(device)))
            for name in self.names:
                weight = opened[self.base[name].file].get_tensor(name)
                target = self.targets.get(name)
                if target is not None:
                    a = lora[target.a_key].to(torch.float32)
                    b = lora[target.b_key].to(torch.float32)
                    # peft's (B @ A) * scale, then + W: in place on the product, one weight-sized buffer
                    weight = torch.matmul(b, a).mul_(self.scale).add_(weight.to(torch.float32))
                yield name, weight if dtype is None else weight.to(dtype)


@contextlib.contextmanager
def _full_fp32_matmul(device: Any) -> Iterator[None]:
    """On CUDA, B @ A in true fp32 even where the host process allowed TF32 (vLLM may)."""
    import torch

    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
