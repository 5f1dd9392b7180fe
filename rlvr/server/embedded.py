"""The embedded engine: continuous-batching generation in this process, CPU or CUDA.

`EmbeddedEngine` loads a HF causal LM and puts together the parts that run it: the scheduler
(`rlvr.server.batching`: one worker thread, continuous batching, pause modes), the weight
receiver (`rlvr.server.receiver`), LoRA adapters (`rlvr.server.adapters`) and the KV cache plan
(`rlvr.server.kv_cache`). Each control call has one implementation, async, as the `RolloutClient`
protocol and the HTTP routes want it; a synchronous caller runs it with
`rlvr.bridge.run_blocking`. Stops and pause modes mirror SGLang's, so the same client and
tests hold for both. docs/engines.md ("Inside the embedded engine", "Stop tokens").
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlvr.bridge import run_blocking
from rlvr.rollout.base import GenerateRequest, PauseMode, parse_version
from rlvr.server.adapters import AdapterLoader
from rlvr.server.batching import Scheduler, default_threads
from rlvr.server.kv_cache import kv_cache_plan, memory_report
from rlvr.server.receiver import WeightReceiver
from rlvr.server.sequences import Seq, eos_ids, make_seqs, to_completion
from rlvr.types import Completion
from rlvr.weight_arena import build_weight_arena

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")


def _version(version: int | str | None) -> str | None:
    return None if version is None else str(version)


class EmbeddedEngine:
    """A `RolloutClient` that runs a HF causal LM itself (see the module docstring)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_batch: int = 64,
        dtype: str = "float32",
        device: str | None = None,
        max_seq_len: int | None = 2048,
        weight_version: str = "0",
        original_logprobs: bool | None = None,
        fast: bool = True,
        max_prefill_tokens: int = 8192,
        threads: int | None = None,
        kv_cache_bytes: int | None = None,
    ):
        """`max_seq_len`: tokens per sequence (prompt + response) the KV cache holds, capped at the
        model's `max_position_embeddings`; `max_batch`: sequences decoded together. The KV cache is
        `max_batch x max_seq_len` tokens, or fewer sequences when `kv_cache_bytes` (a budget)
        cannot hold that many; `max_batch` then becomes what it holds (see `kv_cache_plan`)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.model_path = str(model_path)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer: Any = AutoTokenizer.from_pretrained(self.model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, dtype))
        self.model = model.to(self.device).eval().requires_grad_(False)
        positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or (max_seq_len or 2048)
        self.max_len = min(positions, max_seq_len) if max_seq_len else positions
        self.max_batch = kv_cache_plan(
            self.model.config,
            dtype=getattr(torch, dtype),
            max_batch=max_batch,
            max_len=self.max_len,
            budget_bytes=kv_cache_bytes,
        )
        if original_logprobs is None:
            original_logprobs = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true")
        self.original_logprobs = original_logprobs
        self.eos_ids = eos_ids(self.model, self.tokenizer)
        # Flattened buckets land in place. The weights are read from the files into the arena:
        # the model's own tensors are a lazy mmap of them, and copying from there would map the
        # whole file next to the arena (see rlvr.weight_arena). Built before the backend, which
        # re-points the weights it fuses.
        files = sorted(Path(self.model_path).glob("*.safetensors")) if self.device == "cpu" else []
        arena = build_weight_arena(self.model, files=files)
        self._fast_backend = True  # what a backend rebuilt after `release_kv_cache` should be
        backend = self.make_backend(fast)
        log.info(
            "%s", memory_report(self.model, backend, max_batch=self.max_batch, max_len=self.max_len, device=self.device)
        )
        # OpenMP thread counts are per thread: the worker sets its own (see default_threads).
        self.threads = threads or default_threads(self.model, self.device, torch.get_num_threads())
        self.scheduler = Scheduler(
            backend,
            tokenizer=self.tokenizer,
            max_batch=self.max_batch,
            max_len=self.max_len,
            max_prefill_tokens=max_prefill_tokens,
            original_logprobs=original_logprobs,
            weight_version=str(weight_version),
            threads=self.threads,
        )
        self.weights = WeightReceiver(self.model, self.scheduler, device=self.device, arena=arena)
        self.adapters = AdapterLoader(self.weights, base_path=self.model_path)

    def make_backend(self, fast: bool) -> Any:
        from rlvr.server.decoders import RecomputeDecoder, StaticKVDecoder, fast_path_supported

        ok, why = fast_path_supported(self.model)
        if fast and ok:
            return StaticKVDecoder(self.model, max_slots=self.max_batch, max_len=self.max_len)
        if fast:
            log.warning("embedded engine: generic (slow) HF path: %s", why)
        return RecomputeDecoder(self.model, max_slots=self.max_batch, max_len=self.max_len)

    # -- state ------------------------------------------------------------------------------

    @property
    def backend(self) -> Any:
        """The decoder that owns the KV slots (None while the KV cache is released)."""
        return self.scheduler.backend

    @property
    def weight_version(self) -> str:
        return self.scheduler.weight_version

    @property
    def policy_version(self) -> int:
        return parse_version(self.weight_version)

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: the token ids a prompt may use."""
        return int(self.model.get_input_embeddings().weight.shape[0])

    @property
    def paused(self) -> bool:
        return self.scheduler.paused

    @property
    def worker_alive(self) -> bool:
        return self.scheduler.alive

    @property
    def error(self) -> BaseException | None:
        """What killed the worker thread, if it died."""
        return self.scheduler.error

    def num_running(self) -> int:
        return self.scheduler.num_running()

    def memory_report(self) -> str:
        """One line: what this engine holds (weights, KV cache, packed weight copies, the rest)."""
        return memory_report(
            self.model, self.backend, max_batch=self.max_batch, max_len=self.max_len, device=self.device
        )

    def close(self) -> None:
        self.scheduler.close()

    # -- generating -------------------------------------------------------------------------

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Sample every request's n completions; the flat result keeps request order."""
        return [d["completion"] for d in await self.generate_detailed(requests)]

    async def generate_detailed(self, requests: Sequence[GenerateRequest]) -> list[dict[str, Any]]:
        """Like `generate`, plus SGLang's finish_reason dict and the weight version string (for the server)."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[dict[str, Any]]] = []
        seqs: list[Seq] = []
        for request in requests:
            for seq in make_seqs(request, max_len=self.max_len, vocab=self.vocab_size, eos=self.eos_ids):
                future: asyncio.Future[dict[str, Any]] = loop.create_future()
                seq.on_done = _resolver(loop, future)
                futures.append(future)
                seqs.append(seq)
        self.scheduler.submit(seqs)
        try:
            return list(await asyncio.gather(*futures))
        except asyncio.CancelledError:
            # The caller gave up (an HTTP client disconnected or timed out): stop spending steps on it.
            self.scheduler.abort(seqs)
            raise

    def generate_sync(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """`generate` for benches and scripts without an event loop."""
        return run_blocking(self.generate(requests))

    async def health(self) -> bool:
        return self.worker_alive

    # -- control (each one implementation; see the module docstring) ------------------------

    async def pause(self, mode: PauseMode = "abort") -> int:
        """Pause generation (SGLang's modes); returns how many sequences were aborted or retracted."""
        return await asyncio.to_thread(self.scheduler.pause, mode)

    async def resume(self) -> None:
        self.scheduler.resume()

    def load_state_dict(self, tensors: dict[str, Any] | list[tuple[str, Any]], *, version: str | None) -> None:
        """Copy named HF tensors into the model in place, between steps (blocking: the in-process
        sync calls it from the trainer's thread, bucket by bucket)."""
        self.weights.load_state_dict(tensors, version=version)

    async def update_weights_from_disk(self, path: str | Path, *, version: int | str | None = None) -> None:
        await asyncio.to_thread(self.weights.load_from_disk, path, version=_version(version))

    async def load_lora_adapter(self, path: str | Path, *, version: int | str | None = None) -> None:
        await asyncio.to_thread(self.adapters.load, path, version=_version(version))

    async def weights_fingerprint(self, *, adapter: bool = False) -> dict[str, list[float]]:
        """Per served weight, its XXH3-128 checksum as four 32-bit words (`rlvr.sync.fingerprint`): the
        trainer compares it with what it sent, after every push. `adapter`: instead, the tensors
        of the last LoRA adapter merged, as "adapter:" + their peft key."""
        if adapter:
            return {f"adapter:{key}": list(pair) for key, pair in self.adapters.fingerprint.items()}
        pairs = await asyncio.to_thread(self.weights.fingerprint)
        return {name: list(pair) for name, pair in pairs.items()}

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
        timeout_s: float = 600.0,
    ) -> None:
        await asyncio.to_thread(
            self.weights.join_group,
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
            timeout_s=timeout_s,
        )

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str = "weight_update_group",
        version: int | str | None = None,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> None:
        # No prefix cache to flush (every prefill is fresh); flush_cache marks a sync's last bucket.
        await asyncio.to_thread(
            self.weights.receive_bucket,
            names,
            dtypes,
            shapes,
            group_name=group_name,
            version=_version(version),
            load_format=load_format,
            flush_cache=flush_cache,
        )

    async def begin_weight_update(self) -> None:
        self.weights.begin_session()

    async def end_weight_update(self) -> None:
        self.weights.end_session()

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        self.weights.leave_group(group_name)

    # -- colocation (rollout.colocate): the trainer on this GPU trains while the cache is gone --

    async def release_kv_cache(self) -> None:
        """Abort what runs, stay paused, and free the KV cache (the decoder and its buffers) for
        the trainer that shares this GPU; the weights stay, and the next push replaces them."""
        await asyncio.to_thread(self._drop_backend)

    async def resume_kv_cache(self) -> None:
        """Allocate the KV cache again (the same way as at start) and continue generating."""
        await asyncio.to_thread(self._restore_backend)

    def _drop_backend(self) -> None:
        scheduler = self.scheduler
        scheduler.pause("abort")
        with scheduler.step_lock:
            if scheduler.backend is not None:
                scheduler.backend.wait_packed()  # no packer thread left writing into what is dropped
                self._fast_backend = type(scheduler.backend).__name__ != "RecomputeDecoder"
                scheduler.backend = None
        if str(self.device).startswith("cuda"):
            import torch

            torch.cuda.empty_cache()  # cached blocks are memory the trainer cannot use

    def _restore_backend(self) -> None:
        scheduler = self.scheduler
        with scheduler.step_lock:
            if scheduler.backend is None:
                scheduler.backend = self.make_backend(self._fast_backend)
        scheduler.resume()


def _resolver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[dict[str, Any]]) -> Callable[[Seq], None]:
    """A sequence's `on_done` that hands its result to `future` on `loop` (from the worker thread)."""

    def done(seq: Seq) -> None:
        result = {"completion": to_completion(seq), "finish": dict(seq.finish or {}), "version": seq.version}
        loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

    return done
