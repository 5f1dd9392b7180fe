"""Weight sync through a shared filesystem: export a HF folder, engines load it.

For trainer and rollout nodes that cannot join one NCCL/gloo group: slower than broadcast (a full
write and read per step) but it needs only a directory every node sees. Every rank exports
(collective) to `shared_dir/weights/v{version}`, written as `.tmp` and renamed so an engine never
reads half a folder; then rank 0 pauses and flushes the engines, has them load it with the version,
and resumes, so generation runs on during the export. The folder holds the engines' dtype, and the
safetensors file is written tensor by tensor as they are gathered, so rank 0 never holds the model
in host RAM. The last `keep` folders stay (a slow engine may still be loading the newest).
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from rlvr.sync.base import Decision, SyncError, TensorSpec, agree, weight_specs
from rlvr.sync.buckets import dtype_of, engine_dtype
from rlvr.sync.engine_calls import EngineCalls, EngineFactory
from rlvr.sync.verify import PushVerifier

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


class DiskSync:
    """`WeightSync` through `shared_dir` (see the module docstring); `client` needed on rank 0 only.
    `verify`: compare each engine's fingerprint of what it loaded with what was written (`rlvr.sync.verify`)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        shared_dir: str | Path,
        client: object = None,
        timeout_s: float = 600.0,
        on_engine_failure: str = "fail",
        dtype: torch.dtype | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        keep: int = 2,
        pause_mode: str = "abort",
        engine_factory: EngineFactory | None = None,
        verify: str = "auto",
    ):
        from rlvr.trainer import dist as d

        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.model = model
        self.rank = d.rank()
        self.root = Path(shared_dir) / self.folder
        self.dtype: torch.dtype | Literal[False] | None = dtype  # False: the engines' dtype is unknown, no cast
        self.tokenizer = tokenizer
        self.keep = keep
        self.pause_mode = pause_mode
        self.verifier = PushVerifier(model, mode=verify, adapter=self.verified_as_adapter)
        self.calls: EngineCalls | None = None
        if self.rank == 0:
            if client is None:
                raise ValueError("DiskSync needs the rollout client on trainer rank 0")
            self.calls = EngineCalls(client, timeout_s=timeout_s, on_failure=on_engine_failure, factory=engine_factory)

    folder = "weights"  # under shared_dir: one v{version} folder per push
    load_method = "update_weights_from_disk"  # what each engine is asked to do with the folder
    verified_as_adapter = False  # AdapterSync: the engines report the adapter tensors they merged

    def push(self, *, version: int) -> dict[str, float]:
        start = time.monotonic()
        path = self.root / f"v{version}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
        self._write(path)
        export_s = time.monotonic() - start
        decision = agree(self._load(path, version) if self.rank == 0 else None)
        if self.rank == 0:
            self._prune()
        size = sum(f.stat().st_size for f in path.glob("*.safetensors")) if self.rank == 0 else 0
        return {
            "sync/seconds": time.monotonic() - start,
            "sync/export_seconds": export_s,
            "sync/load_seconds": float(decision.load_s),
            "sync/gb": size / 1e9,
            "sync/engines": float(decision.engines),
            "sync/dropped_engines": float(decision.dropped),
            "sync/verify_s": float(decision.verify_s),
            "sync/verified_engines": float(decision.verified),
            "sync/version": float(version),
        }

    def _write(self, path: Path) -> None:
        """Every rank: the folder the engines load (collective: full tensors are gathered)."""

        from rlvr.trainer import dist as d

        if self.dtype is None:  # the engines' own dtype, once (every rank casts the same way)
            name = d.broadcast_object(self._engine_dtype() if self.rank == 0 else None)
            self.dtype = dtype_of(str(name)) if name else False
        self.verifier.start()
        observe = self.verifier.add if self.rank == 0 and self.verifier.enabled else None
        write_weights(self.model, path, dtype=self.dtype or None, tokenizer=self.tokenizer, observe=observe)

    def _engine_dtype(self) -> str | None:
        """The dtype the live engines serve ("float32", "bfloat16", ...), None if they do not say."""
        calls = self.calls
        assert calls is not None
        names: set[str] = set()
        for answer in calls.results(calls.live(), "server_info").values():
            served = cast("dict[str, object]", answer).get("dtype") if isinstance(answer, dict) else None  # JSON
            if isinstance(served, str):
                names.add(engine_dtype(served, self.model))
        names.discard("")
        return names.pop() if len(names) == 1 else None

    def _load(self, path: Path, version: int) -> Decision:
        calls = self.calls
        assert calls is not None
        start = time.monotonic()
        try:
            calls.recover()
            if not calls.live():
                raise SyncError(f"weight sync to version {version}: no live rollout engine")
            updated: list[str] = []
            # An engine that answers again while this push waits for one (continue mode) joins
            # it: another round for the engines this push has not updated yet.
            for _ in range(len(calls.live()) + 2):
                members = [m for m in calls.live() if m not in updated]
                if not members:
                    break
                calls.handle(calls.unhealthy(members), version=version)  # raises in fail mode
                members = [m for m in members if m not in calls.dropped]
                for stage, method, args, kwargs in (
                    ("pause", "pause", (self.pause_mode,), {}),
                    ("flush", "flush_cache", (), {}),
                    (self.load_method, self.load_method, (str(path),), {"version": version}),
                    ("resume", "resume", (), {}),
                ):
                    failures = calls.call(members, stage, method, *args, **kwargs)
                    if method == self.load_method:  # before resume: a bad engine never serves
                        loaded = [m for m in members if m not in {f.url for f in failures}]
                        failures += self.verifier.check(calls, loaded)
                    calls.handle(failures, version=version)  # raises in fail mode or when none is left
                    members = [m for m in members if m not in calls.dropped]
                updated += members
            calls.admit_rejoined(updated)
            load_s, verify_s, verified = time.monotonic() - start, self.verifier.seconds, self.verifier.verified
            engines, dropped = len(updated), len(calls.dropped)
            return Decision("ok", engines=engines, dropped=dropped, load_s=load_s, verify_s=verify_s, verified=verified)
        except SyncError as exc:
            return Decision.failed(exc)
        except Exception as exc:  # noqa: BLE001 - every rank must learn that rank 0 failed
            log.exception("disk weight sync failed")
            message = f"weight sync to version {version} failed on trainer rank 0: {exc!r}"
            return Decision("fail", message)

    def _prune(self) -> None:
        versions: list[tuple[int, Path]] = []
        for child in self.root.iterdir():
            if child.is_dir() and child.name.startswith("v") and child.name[1:].isdigit():
                versions.append((int(child.name[1:]), child))
        for _, child in sorted(versions)[: -self.keep]:
            shutil.rmtree(child, ignore_errors=True)

    def close(self) -> None:
        if self.calls is not None:
            self.calls.close()


def write_weights(
    model: nn.Module,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    observe: Callable[[str, Tensor], None] | None = None,
) -> Path | None:
    """Write a transformers folder (one model.safetensors, config, tokenizer) from a (sharded)
    model, streaming: at most one full tensor in host RAM at a time.

    Collective: every rank gathers each full tensor in order (`iter_full_weights`); rank 0
    casts it to `dtype` and appends its bytes to the file, whose header was written first
    from the weights' metadata (`weight_specs`: names, shapes and order are the gather's).
    The folder appears atomically (`<out>.tmp`, then renamed). Returns it on rank 0.
    `observe(name, tensor)` sees each tensor as written (rank 0).
    """
    import torch

    from rlvr.trainer import dist as d
    from rlvr.trainer.checkpoint import finish_hf_folder
    from rlvr.trainer.weights import iter_full_weights

    out = Path(out_dir)
    main = d.rank() == 0
    tmp = out.with_name(out.name + ".tmp")
    handle = None
    raw = b""
    if main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        raw = _safetensors_header(weight_specs(model, dtype=dtype))
        handle = open(tmp / "model.safetensors", "wb")  # noqa: SIM115 - closed below, on every path
    try:
        if handle is not None:
            handle.write(struct.pack("<Q", len(raw)) + raw)
        # Rank 0 casts; the others only take part in the gathers.
        for name, tensor in iter_full_weights(model, dtype=dtype if main else None):
            if observe is not None and main:
                observe(name, tensor)
            if handle is not None:
                flat = tensor.detach().contiguous().view(-1)
                handle.write(flat.view(torch.uint8).numpy().tobytes() if flat.numel() < 2**16 else _bytes_of(flat))
    finally:
        if handle is not None:
            handle.close()
    if main:
        finish_hf_folder(model, tmp, out, dtype=dtype, tokenizer=tokenizer)
    d.barrier()
    return out if main else None


def _safetensors_header(specs: list[TensorSpec]) -> bytes:
    """The JSON header of a safetensors file holding `specs` back to back, padded to 8 bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": SAFETENSORS_NAMES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it


def _bytes_of(flat: Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (numpy's buffer protocol)."""
    import torch

    array: Any = flat.view(torch.uint8).numpy()  # numpy's stubs do not declare the buffer protocol
    return memoryview(array).cast("B")


SAFETENSORS_NAMES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
