"""rlvr's weight-transfer backend *inside* a vLLM server: it receives the trainer's broadcast.

It runs in vLLM's own Python, never rlvr's: vLLM loads it through its plug-in entry point group
`vllm.general_plugins` in every process, and `register` adds the backend `rlvr` to vLLM's
`WeightTransferEngineFactory`; so it imports only torch, vLLM, `rlvr.sync.group` and
`rlvr.server.lora_merge`. vLLM's own backends need an accelerator and vLLM in the trainer's env;
this one joins the group SGLang and `rlvr serve` join, so `BroadcastSync` is one path for all.
Each bucket is checked against the served model before it loads (a failed reload cannot be undone)
and loads on a thread while the next one arrives; the last bucket raises the push's first failure
after closing vLLM's layerwise reload (where vLLM drops the version and the session), and the finish
re-packs the tied LM head the CPU reload leaves stale. A LoRA push merges the adapter here. For
`sync.verify`, vLLM's workers answer `/collective_rpc` (`rlvr_weights_fingerprint`, added to the
worker) with the fingerprint (`rlvr.sync.fingerprint`) of the weights the model computes with, read
back from the loaded layers when asked (`served_weights`: fused q/k/v and gate/up split back into
the HF tensors; on CPU, where vLLM keeps a linear layer's weight only in its packed kernel, the
layer is applied to an identity, the tied LM head included), so a weight the loader left stale or a
head that stopped following its embedding shows. What cannot be read back (tensor parallel,
quantized layers, a name no layer maps) keeps the fingerprint of what was received, taken on the
load thread.
docs/engines.md (vLLM) and docs/weight-sync.md say why each step is needed.
"""

# pyright: reportMissingImports=false
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("vllm.rlvr")

BACKEND = "rlvr"


def register() -> None:
    """vLLM's plug-in hook (entry point `rlvr = rlvr.server.vllm_plugin:register`)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "RlvrWeightTransfer")


def _engine_base() -> Any:
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    return WeightTransferEngine


def _info_bases() -> tuple[Any, Any]:
    from vllm.distributed.weight_transfer.base import WeightTransferInitInfo, WeightTransferUpdateInfo

    return WeightTransferInitInfo, WeightTransferUpdateInfo


_InitBase, _UpdateBase = _info_bases()


@dataclass
class RlvrInitInfo(_InitBase):
    """The body of `/init_weight_transfer_engine`'s `init_info` (SGLang's group fields)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "gloo"
    timeout_s: float = 600.0


@dataclass
class RlvrUpdateInfo(_UpdateBase):
    """One bucket: tensor names, dtypes ("float32") and shapes, in broadcast order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    load_format: str | None = None
    path: str | None = None
    """A HF safetensors folder to load instead of a broadcast (`sync.method = "disk"`)."""
    adapter_path: str | None = None
    """A peft LoRA adapter folder to merge into the base weights instead of a broadcast."""
    last: bool = False
    """The push's last bucket (the one that carries its version): a refusal is reported with it."""


class RlvrWeightTransfer(_engine_base()):
    """vLLM `WeightTransferEngine` over an rlvr/SGLang-style update group (module docstring)."""

    init_info_cls = RlvrInitInfo
    update_info_cls = RlvrUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.group: Any = None
        self._loader: Any = None  # one thread: bucket k loads while bucket k + 1 is on the wire
        self._loads: list[Any] = []
        self._adapter_weights: frozenset[str] = frozenset()  # what the last adapter merged
        self._quiet: Any = None  # the reload-warning filter of an adapter session
        self._base_shapes: dict[str, list[int]] | None = None  # the served weights' names and shapes
        # Why a bucket of this push was refused. The refusal is raised with the last bucket, not at
        # once: vLLM then refuses every later request of the push before receiving it, and the
        # trainer's gloo send of that bucket would wait for a receive that never comes.
        self._refusal: str | None = None
        self._session = False  # between start_weight_update and the reload's finalize
        self._fingerprint: Any = None  # this push's Fingerprinter, fed as each bucket loads
        self._fingerprint_lock = threading.Lock()  # loads run on the load thread, or inline
        self.received_fingerprint: dict[str, tuple[int, int, int, int]] = {}  # the last push's, as received
        self.adapter_fingerprint: dict[str, tuple[int, int, int, int]] = {}  # the last adapter merged, by peft key
        _add_worker_route()

    def init_transfer_engine(self, init_info: RlvrInitInfo) -> None:
        from rlvr.sync.group import join_group_like_sglang

        self.shutdown()
        parallel = self.parallel_config
        rank = parallel.data_parallel_index * parallel.world_size + parallel.rank + init_info.rank_offset
        self.group = join_group_like_sglang(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank=rank,
            world_size=init_info.world_size,
            group_name=init_info.group_name,
            backend=init_info.backend,
            timeout_s=init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        from rlvr.sync.fingerprint import Fingerprinter

        self._wait_loads()  # a session left open by a failed push
        self._refusal = None
        self._fingerprint, self.received_fingerprint = Fingerprinter(), {}
        initialize_layerwise_reload(self.model)
        self._session = True
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlvr-weight-load")

    def receive_weights(self, update_info: RlvrUpdateInfo) -> None:
        import torch

        if update_info.path is not None:
            try:
                self._check_folder(update_info.path)
                with torch.no_grad():
                    self.model.load_weights(self._fingerprinted(_folder_weights(update_info.path)))
            except BaseException:
                # start_weight_update made every parameter a placeholder, and vLLM ends a session whose
                # update raised without finalizing it: put the untouched weights back.
                self._close_failed_session()
                raise
            return
        if update_info.adapter_path is not None:
            self._load_adapter(update_info.adapter_path)
            return
        if self.group is None:
            raise RuntimeError("no weight-update group: call /init_weight_transfer_engine first")
        start = time.perf_counter()
        try:
            weights = self._receive_bucket(update_info)
        except BaseException:  # a broken group: vLLM ends its session, so the reload must not stay open
            self._close_failed_session()
            raise
        received = time.perf_counter()
        if self._refusal is None:
            try:
                self._check_shapes(("bucket tensor ", name, list(tensor.shape)) for name, tensor in weights)
            except ValueError as exc:  # the rest of the push is received, not loaded (see _refusal)
                self._refusal = str(exc)
            else:
                if self._loader is None:  # no session (vLLM starts one first): load here
                    self._load(weights, received - start)
                else:  # answer now, so the trainer sends the next bucket while this one loads
                    self._loads.append(self._loader.submit(self._load, weights, received - start))
        if update_info.last:  # every load in, or the session's failure, before the version is set
            try:
                self._wait_loads()
            except BaseException as exc:  # noqa: BLE001 - reported like a refused bucket
                self._refusal = self._refusal or f"{type(exc).__name__}: {exc}"
            if self._refusal is not None:
                refusal = self._refusal
                self._close_failed_session()
                raise ValueError(refusal)

    def _receive_bucket(self, update_info: RlvrUpdateInfo) -> list[tuple[str, Any]]:
        """One bucket's tensors off the group (for a flattened bucket: views of one fresh buffer,
        since the reload keeps the tensors it is given)."""
        import torch

        from rlvr.sync.group import receive_broadcast, receive_into, torch_dtype

        device = self.group.device
        if update_info.load_format != "flattened_bucket":
            return receive_broadcast(
                self.group, update_info.names, update_info.dtype_names, update_info.shapes, device=device
            )
        dtypes = [torch_dtype(d) for d in update_info.dtype_names]
        sizes = [
            _numel(s) * torch.empty((), dtype=d).element_size() for s, d in zip(update_info.shapes, dtypes, strict=True)
        ]
        flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
        receive_into(self.group, [flat])
        weights, offset = [], 0
        for name, dtype, shape, size in zip(update_info.names, dtypes, update_info.shapes, sizes, strict=True):
            weights.append((name, flat[offset : offset + size].view(dtype).view(tuple(shape))))
            offset += size
        return weights

    def _load_adapter(self, path: str) -> None:
        """Merge a peft adapter into the base and load what it changes (module docstring)."""
        import torch

        from rlvr.server.lora_merge import AdapterMerge

        start = time.perf_counter()
        self._quiet = self._quiet or _quiet_reload_warnings()
        merge: Any = None
        try:
            packed = dict(getattr(self.model, "packed_modules_mapping", None) or {})
            merge = AdapterMerge(path, _base_folder(self.vllm_config), previous=self._adapter_weights,
                                 packed_modules=packed)  # fmt: skip
            with torch.no_grad():
                self.model.load_weights(merge.tensors(dtype=self.model_config.dtype, device=self.device))
        except BaseException:
            if merge is not None:  # part may be in: the next adapter puts these back to the base too
                self._adapter_weights = self._adapter_weights | merge.merged
            self._close_failed_session()
            raise
        self._adapter_weights = merge.merged
        self.adapter_fingerprint = dict(merge.fingerprint)
        log.info(
            "rlvr LoRA adapter %s: %d weights merged, %d back to the base, %d fused siblings in %.3f s",
            path, len(merge.merged), len(merge.restored), len(merge.siblings), time.perf_counter() - start,
        )  # fmt: skip

    def _check_shapes(self, tensors: Iterable[tuple[str, str, list[int]]]) -> None:
        """Every (where, name, shape) must be a served weight of that shape, checked before any of
        them loads: a tensor that fails half-way through vLLM's layerwise reload cannot be undone
        (finalizing the reload replays it and fails again), and the engine dies. Raises ValueError
        with `where` + the name (for a bucket, that becomes the push's refusal: see `_refusal`)."""
        from rlvr.server.lora_merge import base_index

        if self._base_shapes is None:  # the folder vLLM was started on, read once
            index = base_index(_base_folder(self.vllm_config))
            self._base_shapes = {name: list(tensor.shape) for name, tensor in index.items()}
        for where, name, shape in tensors:
            want = self._base_shapes.get(name)
            if want is None:
                raise ValueError(f"{where}{name} is not a weight of the served model")
            if shape != want:
                raise ValueError(f"{where}{name} has shape {shape}, the served model's is {want}")

    def _check_folder(self, path: str) -> None:
        """A pushed folder's tensors, from its safetensors headers (no tensor read), as `_check_shapes`."""
        from rlvr.server.lora_merge import base_index

        self._check_shapes((f"{t.file.name} in {path}: ", name, list(t.shape)) for name, t in base_index(path).items())

    def _close_failed_session(self) -> None:
        """Finalize the reload after a failed update: the buckets that loaded stay, every other layer
        gets its own tensors back (vLLM ends a session whose update raised without finalizing it)."""
        with contextlib.suppress(Exception):  # the refusal being raised is the failure to report
            self._wait_loads()
        self._refusal = None
        if self._session:
            self._finalize()  # an earlier bucket may have brought a new embedding: the head is re-packed too

    def _finalize(self) -> None:
        """End the session's reload (every layer that got tensors is rebuilt), then re-pack a tied LM
        head's CPU copy from the (shared, maybe updated) embedding (module docstring)."""
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        self._session = False
        try:
            finalize_layerwise_reload(self.model, self.model_config)
        finally:
            self._quiet = _loud(self._quiet)
        for module in self.model.modules():
            if isinstance(module, ParallelLMHead) and hasattr(module, "cpu_linear"):
                module.quant_method.process_weights_after_loading(module)

    def _fingerprinted(self, weights: Iterable[tuple[str, Any]]) -> Iterable[tuple[str, Any]]:
        """`weights` as they go into vLLM's loader, each fingerprinted on the way (a disk push)."""
        for name, tensor in weights:
            self._record([(name, tensor)])
            yield name, tensor

    def _record(self, weights: list[tuple[str, Any]]) -> None:
        """Add `weights` to this push's fingerprint (none outside a session)."""
        if self._fingerprint is not None:
            with self._fingerprint_lock:
                for name, tensor in weights:
                    self._fingerprint.add(name, tensor)

    def _load(self, weights: list[tuple[str, Any]], receive_s: float) -> None:
        import torch

        start = time.perf_counter()
        self._record(weights)  # on the load thread: hidden behind the next bucket's receive
        summed = time.perf_counter()
        with torch.no_grad():
            self.model.load_weights(weights)
        log.info(
            "rlvr weights: %d tensors, %.1f MB: received in %.3f s, fingerprinted in %.3f s, loaded in %.3f s",
            len(weights), sum(w.numel() * w.element_size() for _, w in weights) / 1e6, receive_s, summed - start,
            time.perf_counter() - summed,
        )  # fmt: skip

    def _wait_loads(self) -> None:
        """Every bucket's load, in order; the first failure raises (so the session sets no version)."""
        loads, self._loads = self._loads, []
        loader, self._loader = self._loader, None
        try:
            for load in loads:
                load.result()
        finally:
            if loader is not None:
                loader.shutdown(wait=True)

    def finish_weight_update(self) -> None:
        start = time.perf_counter()
        if self._refusal is not None or self._loads:  # a push the trainer gave up before its last bucket
            self._close_failed_session()
            log.warning("rlvr weights: a push ended before its last bucket; its weight version is not set")
            return
        self._finalize()
        if self._fingerprint is not None:
            with self._fingerprint_lock:
                self.received_fingerprint, self._fingerprint = self._fingerprint.result(), None
        log.info("rlvr weights: reload finished in %.3f s", time.perf_counter() - start)

    def served_fingerprint(self) -> dict[str, tuple[int, int, int, int]]:
        """The fingerprint of the weights served now, under HF names: read back from the model
        (`served_weights`) where it can be, else (with one log line) what the last push received."""
        from rlvr.sync.fingerprint import fingerprint

        start = time.perf_counter()
        out = dict(self.received_fingerprint)
        if self.parallel_config.world_size > 1:  # each worker holds shards, the trainer hashed whole tensors
            read: dict[str, tuple[int, int, int, int]] = {}
        else:
            read = fingerprint(served_weights(self.model, self.model_config.dtype).items())
        out.update(read)
        unread = [name for name in self.received_fingerprint if name not in read]
        if getattr(self.model_config.hf_config, "tie_word_embeddings", False) and "lm_head.weight" not in out:
            embedding = out.get("model.embed_tokens.weight")  # vLLM serves one tensor
            if embedding is not None:
                out["lm_head.weight"] = embedding
        if unread:
            log.warning(
                "rlvr weights: %d of %d received tensors not read back from the loaded model (%s%s): "
                "their fingerprint is of what was received",
                len(unread), len(self.received_fingerprint), ", ".join(unread[:3]), " ..." if len(unread) > 3 else "",
            )  # fmt: skip
        log.info(
            "rlvr weights: %d weights read back and fingerprinted in %.3f s", len(read), time.perf_counter() - start
        )
        return out

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):  # loads of a session that will not finish
            self._wait_loads()
        if self.group is not None:
            self.group.shutdown()
            self.group = None


def _add_worker_route() -> None:
    """`collective_rpc("rlvr_weights_fingerprint", kwargs={"adapter": ""|"1"})` on vLLM's workers: the
    fingerprint of the last push as this worker received it (or of the last adapter it merged, as
    "adapter:" + peft key). Added once the worker has this backend, so only vLLM's workers carry it."""
    from vllm.v1.worker.gpu_worker import Worker

    if not hasattr(Worker, "rlvr_weights_fingerprint"):
        Worker.rlvr_weights_fingerprint = _worker_fingerprint


def _worker_fingerprint(worker: Any, adapter: str = "") -> dict[str, list[int]]:
    engine = getattr(worker, "weight_transfer_engine", None)
    if not isinstance(engine, RlvrWeightTransfer):
        return {}
    if adapter:
        return {f"adapter:{key}": list(words) for key, words in engine.adapter_fingerprint.items()}
    import torch

    with torch.no_grad():
        return {name: list(words) for name, words in engine.served_fingerprint().items()}


PROBE_ROWS = 1024
"""Rows of the identity a CPU-packed layer is applied to at once (bounds the probe's memory)."""


def served_weights(model: Any, dtype: Any) -> dict[str, Any]:
    """HF name -> the tensor the model computes with, read back from its layers (one worker, no
    tensor parallelism), in `dtype`: every unquantized linear layer (fused q/k/v and gate/up split
    back by `packed_modules_mapping` and the layer's `output_sizes`) and LM head, every vocab
    embedding (without vLLM's padding rows), and every other layer's own parameters (norms) as they
    are. A linear layer or head whose weight lives in a packed CPU kernel (vLLM-CPU drops the
    parameter) is read by applying it to an identity: exact, since each output is one weight times
    1 plus zeros. Quantized layers are left out."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", None) or {})
    out: dict[str, Any] = {}
    for prefix, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(module, ParallelLMHead):
            if isinstance(method, UnquantizedEmbeddingMethod):
                out[f"{prefix}.weight"] = _applied(module, module.embedding_dim)[: module.org_vocab_size]
        elif isinstance(module, VocabParallelEmbedding):
            if isinstance(method, UnquantizedEmbeddingMethod):
                out[f"{prefix}.weight"] = module.weight[: module.org_vocab_size]
        elif isinstance(module, LinearBase):
            if not isinstance(method, UnquantizedLinearMethod):
                continue
            parts = _parts(prefix, module, packed)
            weight = _applied(module, module.input_size)
            for (name, _), part in zip(parts, weight.split([r for _, r in parts]), strict=True):
                out[f"{name}.weight"] = part
            bias = getattr(module, "bias", None)
            if bias is not None and bias.numel():
                for (name, _), part in zip(parts, bias.split([r for _, r in parts]), strict=True):
                    out[f"{name}.bias"] = part
        else:
            for name, param in module.named_parameters(recurse=False):
                if param.numel():
                    out[f"{prefix}.{name}" if prefix else name] = param
    return {name: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t for name, t in out.items()}


def _parts(prefix: str, module: Any, packed: dict[str, list[str]]) -> list[tuple[str, int]]:
    """(HF module name, rows) of a linear layer: a fused one (qkv_proj, gate_up_proj) per part."""
    parent, _, leaf = prefix.rpartition(".")
    sizes = list(getattr(module, "output_sizes", None) or [])
    names = packed.get(leaf, [])
    if len(names) > 1 and len(names) == len(sizes):
        return [(f"{parent}.{name}" if parent else name, int(size)) for name, size in zip(names, sizes, strict=True)]
    return [(prefix, int(module.output_size))]


def _applied(module: Any, inputs: int) -> Any:
    """The [outputs, inputs] weight `module` multiplies by: its parameter where the kernel reads
    it, else (vLLM-CPU's packed kernels) the layer applied to an identity, PROBE_ROWS rows at a time."""
    import torch

    weight = module.weight
    if not hasattr(module, "cpu_linear"):
        return weight
    eye = torch.eye(inputs, dtype=weight.dtype, device=weight.device)
    cols = [module.quant_method.apply(module, eye[i : i + PROBE_ROWS]) for i in range(0, inputs, PROBE_ROWS)]
    return torch.cat(cols).t()


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _NoUnloadedLayerWarnings(logging.Filter):
    """Drops the reload's "<layer>: Failed to load weights": an adapter session loads only the
    layers it changes, and the others keep their tensors on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "%s: Failed to load weights"


def _quiet_reload_warnings() -> logging.Filter:
    quiet = _NoUnloadedLayerWarnings()
    logging.getLogger(RELOAD_LOGGER).addFilter(quiet)
    return quiet


def _loud(quiet: logging.Filter | None) -> None:
    if quiet is not None:
        logging.getLogger(RELOAD_LOGGER).removeFilter(quiet)


def _base_folder(vllm_config: Any) -> str:
    """The folder of the weights vLLM was started on (a hub id: its local snapshot)."""
    from pathlib import Path

    model = str(vllm_config.model_config.model)
    if Path(model).is_dir():
        return model
    from huggingface_hub import snapshot_download

    return snapshot_download(
        model, revision=vllm_config.model_config.revision, cache_dir=vllm_config.load_config.download_dir,
        local_files_only=True, allow_patterns=["*.safetensors", "*.json"],
    )  # fmt: skip


def _folder_weights(path: str) -> Any:
    """Every tensor of a HF safetensors folder, file by file (one file's tensors in memory at a time)."""
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    for file in files:
        yield from load_file(str(file)).items()


def _numel(shape: list[int]) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n
