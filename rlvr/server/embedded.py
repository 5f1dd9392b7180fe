"""The embedded engine: continuous-batching generation in this process, CPU or CUDA.

One worker thread owns the model and runs the scheduling loop; `generate` (async) and
`generate_sync` only enqueue and wait. Each iteration holds the step lock for one prefill-or-decode
step, so control calls (pause, weight updates) land between steps and never see half-updated state.
Live sequences sit packed in the backend's KV slots: waiting ones are admitted while there is room
(the n samples of a prompt share one prefill), and a finished one leaves at once, so the batch never
carries dead rows. Stops and pause modes (`abort`, `retract`, `in_place`) mirror SGLang's, so the
same client and tests hold for both. docs/engines.md ("Inside the embedded engine", "Stop tokens").
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.rollout.base import GenerateRequest, PauseMode, SamplingParams, parse_version
from rlvr.types import Completion
from rlvr.weight_arena import back_to_back_bytes, build_weight_arena

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")
ADAPTER_BUCKET_BYTES = 256 * 2**20
"""Merged LoRA weights built before they are copied in (`load_lora_adapter_sync`): bounds the
transient memory of an adapter load to one bucket, not every targeted weight."""


@dataclass(slots=True, eq=False)
class _Seq:
    """One sequence being generated (one of a request's n samples)."""

    prompt: list[int]
    params: SamplingParams
    rng: random.Random
    on_done: Callable[[_Seq], None]
    stop_ids: frozenset[int]
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the slot's cache
    finish: dict[str, Any] | None = None
    text: str = ""
    version: str = "0"
    started: float = field(default_factory=time.monotonic)

    @property
    def pending(self) -> int:
        return self.out[-1]


SMALL_HIDDEN = 256


def kv_bytes_per_token(config: Any, dtype: Any) -> int:
    """Bytes of K and V one token takes in the fast path's cache (every layer)."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * dtype.itemsize


class KVBudgetError(ValueError):
    """The KV cache budget cannot hold one sequence of the engine's length."""


def kv_cache_plan(config: Any, *, dtype: Any, max_batch: int, max_len: int, budget_bytes: int | None) -> int:
    """Sequences the KV cache holds: `max_batch`, or fewer when `budget_bytes` cannot hold
    `max_batch` sequences of `max_len` tokens. Why a budget: the cache is preallocated, so its
    size is paid whether or not the batch fills it; a recipe sizes it to what it needs."""
    if budget_bytes is None:
        return max_batch
    per_sequence = kv_bytes_per_token(config, dtype) * max_len
    fits = budget_bytes // per_sequence
    if fits < 1:
        raise KVBudgetError(
            f"KV cache budget {budget_bytes / 1e9:.3g} GB holds no sequence of {max_len} tokens "
            f"({per_sequence / 1e9:.3g} GB each); raise the budget or shorten the sequences"
        )
    return int(min(max_batch, fits))


def _unique_tensors(model: Any) -> list[Any]:
    seen: set[int] = set()
    out = []
    for tensor in model.state_dict(keep_vars=True).values():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out.append(tensor)
    return out


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _rss_bytes() -> int:
    """This process's resident set (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _default_threads(model: Any, device: str, available: int) -> int:
    """Intra-op threads for the engine's worker thread.

    Why not always torch's default: the engine steps on its own thread, and there splitting
    small ops across OpenMP threads costs more than it saves. Measured on the 2-core CI
    machines, a decode step of the 0.1M model (hidden 64) takes 601 us on 2 threads against
    376 us on 1 (465 us on 2 threads from the main thread), while the 45.7M model (hidden
    512) needs both cores (12.2 ms against 19.7 ms). So CPU models narrower than
    `SMALL_HIDDEN` get one thread; `threads=` overrides.
    """
    hidden = int(getattr(model.config, "hidden_size", 0) or 0)
    if device == "cpu" and 0 < hidden < SMALL_HIDDEN:
        return 1
    return available


class EmbeddedEngine:
    """A `RolloutEngine` that runs a HF causal LM itself (see the module docstring)."""

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
        self.max_prefill_tokens = max_prefill_tokens
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
        self.weight_version = str(weight_version)
        self.eos_ids = self._eos_ids()
        # Flattened buckets land in place. The weights are read from the files into the arena:
        # the model's own tensors are a lazy mmap of them, and copying from there would map the
        # whole file next to the arena (see rlvr.weight_arena).
        files = sorted(Path(self.model_path).glob("*.safetensors")) if self.device == "cpu" else []
        self._weight_arena = build_weight_arena(self.model, files=files)
        self.backend = self._make_backend(fast)
        log.info("%s", self.memory_report())

        self._lock = threading.RLock()  # held for one step; control calls take it between steps
        self._wakeup = threading.Condition(threading.Lock())
        self._waiting: deque[_Seq] = deque()
        self._live: list[_Seq] = []
        self._to_abort: list[_Seq] = []
        self._paused = False
        self._closed = False
        self._error: BaseException | None = None
        self._weight_groups: dict[str, Any] = {}
        self.update_session = False  # SGLang 0.5.23: distributed updates only inside begin/end
        self._session_table: dict[str, Any] | None = None  # the weight table, built once per session
        self._derived_stale = False  # a session's bucket landed without the refresh of derived tensors
        self._staging: dict[tuple[Any, ...], list[Any]] = {}  # (dtype, shape, device) -> receive buffers
        self._adapter_weights: frozenset[str] = frozenset()  # what the last LoRA adapter merged (load_lora_adapter)
        # OpenMP thread counts are per thread: the worker sets its own (see _default_threads).
        self._threads = threads or _default_threads(self.model, self.device, torch.get_num_threads())
        self._thread = threading.Thread(target=self._run, name="rlvr-embedded-engine", daemon=True)
        self._thread.start()

    # -- setup ------------------------------------------------------------------------------

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        return frozenset(ids)

    def _make_backend(self, fast: bool) -> Any:
        from rlvr.server.decoders import RecomputeDecoder, StaticKVDecoder, fast_path_supported

        ok, why = fast_path_supported(self.model)
        if fast and ok:
            return StaticKVDecoder(self.model, max_slots=self.max_batch, max_len=self.max_len)
        if fast:
            log.warning("embedded engine: generic (slow) HF path: %s", why)
        return RecomputeDecoder(self.model, max_slots=self.max_batch, max_len=self.max_len)

    def memory_report(self) -> str:
        """One line: what this engine holds (weights, KV cache, packed weight copies, the rest)."""
        weights = sum(t.numel() * t.element_size() for t in _unique_tensors(self.model))
        kv = int(getattr(self.backend, "kv_cache_bytes", 0))
        packed = int(getattr(self.backend, "packed_bytes", 0))
        slots = int(getattr(self.backend, "max_slots", self.max_batch)) if kv else 0
        # On CPU the cache's pages are committed as positions are written (decoders._lazy_zeros):
        # what it holds now is inside the process RSS, hence inside "other".
        lazy = self.device == "cpu"
        line = (
            f"embedded engine holds: weights {_mb(weights)} ({str(self.model.dtype).removeprefix('torch.')}); "
            f"KV cache {slots * self.max_len if kv else 0} tokens = {slots} sequences x {self.max_len} tokens, "
            f"{_mb(kv)}{' at most, committed as written' if lazy else ''}; packed weight copies {_mb(packed)}"
        )
        rss = _rss_bytes()
        if rss and lazy:
            line += f"; other {_mb(max(0, rss - weights - packed))} (process RSS {_mb(rss)})"
        return line

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: the token ids a prompt may use."""
        return int(self.model.get_input_embeddings().weight.shape[0])

    @property
    def policy_version(self) -> int:
        return parse_version(self.weight_version)

    # -- submitting -------------------------------------------------------------------------

    def _make_seqs(self, request: GenerateRequest, on_done: Callable[[_Seq], None]) -> list[_Seq]:
        if not request.input_ids:
            raise ValueError("empty prompt")
        if len(request.input_ids) >= self.max_len:
            raise ValueError(f"prompt has {len(request.input_ids)} tokens; the engine's max_len is {self.max_len}")
        vocab = self.vocab_size
        bad = next((t for t in request.input_ids if not 0 <= t < vocab), None)
        if bad is not None:  # an out-of-range id would fail inside the worker's step, for every request
            raise ValueError(f"input_ids: token id {bad} is outside the vocabulary [0, {vocab})")
        bad = next((t for t in request.params.stop_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"stop_token_ids: token id {bad} is outside the vocabulary [0, {vocab})")
        if request.n < 1:
            raise ValueError(f"n: must be at least 1, got {request.n}")
        params = request.params
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_ids)
        seqs = []
        for j in range(request.n):
            seed = params.seed + j if params.seed is not None else random.getrandbits(63)
            seqs.append(_Seq(list(request.input_ids), params, random.Random(seed), on_done, stop_ids))
        return seqs

    def _submit(self, seqs: list[_Seq]) -> None:
        if self._error is not None:
            raise RuntimeError(f"embedded engine worker died: {self._error!r}")
        with self._wakeup:
            self._waiting.extend(seqs)
            self._wakeup.notify()

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Sample every request's n completions; the flat result keeps request order."""
        return [d["completion"] for d in await self.generate_detailed(requests)]

    async def generate_detailed(self, requests: Sequence[GenerateRequest]) -> list[dict[str, Any]]:
        """Like `generate`, plus SGLang's finish_reason dict and the weight version string (for the server)."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[dict[str, Any]]] = []
        seqs: list[_Seq] = []
        for request in requests:
            for seq in self._make_seqs(request, lambda s: None):
                future: asyncio.Future[dict[str, Any]] = loop.create_future()
                seq.on_done = self._resolver(loop, future)
                futures.append(future)
                seqs.append(seq)
        self._submit(seqs)
        try:
            return list(await asyncio.gather(*futures))
        except asyncio.CancelledError:
            # The caller gave up (an HTTP client disconnected or timed out): stop spending steps on it.
            self.abort(seqs)
            raise

    def _resolver(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[dict[str, Any]]
    ) -> Callable[[_Seq], None]:
        def done(seq: _Seq) -> None:
            result = {"completion": self.to_completion(seq), "finish": dict(seq.finish or {}), "version": seq.version}
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

        return done

    def generate_sync(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Blocking `generate`, for benches and scripts without an event loop."""
        results: list[Completion | None] = []
        events: list[threading.Event] = []
        seqs: list[_Seq] = []

        def bind(index: int, event: threading.Event) -> Callable[[_Seq], None]:
            def done(seq: _Seq) -> None:
                results[index] = self.to_completion(seq)
                event.set()

            return done

        for request in requests:
            for seq in self._make_seqs(request, lambda s: None):
                event = threading.Event()
                results.append(None)
                seq.on_done = bind(len(events), event)
                events.append(event)
                seqs.append(seq)
        self._submit(seqs)
        for event in events:
            while not event.wait(1.0):
                if self._error is not None:
                    raise RuntimeError(f"embedded engine worker died: {self._error!r}")
        return [r for r in results if r is not None]

    def to_completion(self, seq: _Seq) -> Completion:
        finish = seq.finish or {"type": "abort"}
        return Completion(
            text=seq.text,
            token_ids=list(seq.out),
            logprobs=list(seq.logprobs),
            finish_reason=str(finish["type"]),
            prompt_token_ids=list(seq.prompt),
            policy_version=parse_version(seq.version),
        )

    # -- the worker loop --------------------------------------------------------------------

    def _run(self) -> None:
        import torch

        torch.set_num_threads(self._threads)
        try:
            while True:
                with self._wakeup:
                    while (
                        not self._closed and not self._to_abort and (self._paused or not (self._waiting or self._live))
                    ):
                        self._wakeup.wait()
                    if self._closed:
                        return
                with self._lock:
                    self._drop_aborted()  # even while paused: a cancelled request frees its slot now
                    if not self._paused:
                        self._step()
        except BaseException as exc:  # noqa: BLE001 - a dead worker must fail every waiter, not hang them
            log.exception("embedded engine worker died")
            self._error = exc
            with self._lock:
                for seq in [*self._live, *self._waiting]:
                    self._finish(seq, {"type": "abort", "message": f"engine error: {exc!r}"})
                self._live.clear()
                self._waiting.clear()

    def abort(self, seqs: Sequence[_Seq]) -> None:
        """Ask the worker to drop these sequences at its next step (they finish with "abort")."""
        with self._wakeup:
            self._to_abort.extend(seqs)
            self._wakeup.notify()

    def _drop_aborted(self) -> None:
        with self._wakeup:
            doomed = {id(s) for s in self._to_abort}
            self._to_abort.clear()
            if not doomed:
                return
            waiting = [s for s in self._waiting if id(s) in doomed]
            self._waiting = deque(s for s in self._waiting if id(s) not in doomed)
        live = [s for s in self._live if id(s) in doomed]
        for seq in live:
            seq.finish = {"type": "abort", "message": "Abort by the client."}
        if live:
            self._remove(live)
        for seq in waiting:
            self._finish(seq, {"type": "abort", "message": "Abort by the client."})

    def _step(self) -> None:
        """Admit what fits, else decode one token for every live sequence."""
        admitted = self._admit()
        if admitted:
            return  # finishing right after prefill may have freed slots: admit again before decoding
        if self._live:
            self._decode()

    def _admit(self) -> bool:
        free = self.max_batch - len(self._live)
        if free <= 0:
            return False
        with self._wakeup:
            batch: list[_Seq] = []
            seen: set[tuple[int, ...]] = set()
            tokens = 0
            while self._waiting and len(batch) < free:
                seq = self._waiting[0]
                key = tuple(seq.prompt + seq.out)
                cost = 0 if key in seen else len(key)  # copies of a prompt in this batch cost nothing
                if batch and tokens + cost > self.max_prefill_tokens:
                    break
                batch.append(self._waiting.popleft())
                seen.add(key)
                tokens += cost
        if not batch:
            return False
        # The n samples of one prompt (and any identical prompts) share one prefill.
        unique: dict[tuple[int, ...], int] = {}
        inputs: list[list[int]] = []
        source: list[int] = []
        for seq in batch:
            key = tuple(seq.prompt + seq.out)
            if key not in unique:
                unique[key] = len(inputs)
                inputs.append(list(key))
            source.append(unique[key])
        first = len(self._live)
        logits = self.backend.prefill(first, inputs)  # unique input u lands in slot first + u
        placed: list[_Seq] = [batch[0]] * len(batch)
        rows = [0] * len(batch)
        taken: set[int] = set()
        next_copy = first + len(inputs)
        for seq, src in zip(batch, source, strict=True):
            if src not in taken:
                taken.add(src)
                slot = first + src
            else:
                slot = next_copy
                next_copy += 1
                self.backend.move(first + src, slot, len(inputs[src]))
            placed[slot - first] = seq
            rows[slot - first] = src
            seq.cached = len(inputs[src])
        self._live.extend(placed)
        import torch

        self._sample_and_check(placed, logits[torch.tensor(rows, device=logits.device)])
        return True

    def _decode(self) -> None:
        live = self._live
        logits = self.backend.decode([s.pending for s in live], [s.cached for s in live])
        for seq in live:
            seq.cached += 1
        self._sample_and_check(list(live), logits)

    def _sample_and_check(self, seqs: list[_Seq], logits: Any) -> None:
        from rlvr.server.sampling import RowSampling, is_greedy, sample_greedy, sample_plain, sample_rows, truncates

        params = [s.params for s in seqs]
        if all(is_greedy(p.temperature, p.top_k) for p in params):
            tokens, logprobs = sample_greedy(logits)  # no per-row settings or draws to gather
        elif not self.original_logprobs and not any(
            is_greedy(p.temperature, p.top_k) or truncates(p.top_p, p.top_k, p.min_p) for p in params
        ):
            # Every row samples from its full distribution: same draws as sample_rows, less Python.
            tokens, logprobs = sample_plain(logits, [p.temperature for p in params], [s.rng.random() for s in seqs])
        else:
            rows = [
                RowSampling(s.params.temperature, s.params.top_p, s.params.top_k, s.params.min_p, s.rng.random())
                for s in seqs
            ]
            tokens, logprobs = sample_rows(logits, rows, original=self.original_logprobs)
        done: list[_Seq] = []
        max_len = self.max_len
        for seq, token, logprob in zip(seqs, tokens, logprobs, strict=True):
            seq.out.append(token)
            seq.logprobs.append(logprob)
            # The common case (no stop hit, room left) in one line; `_stop_reason` says which stop it was.
            if (
                token in seq.stop_ids
                or seq.params.stop
                or len(seq.out) >= seq.params.max_new_tokens
                or seq.cached + 1 >= max_len
            ):
                reason = self._stop_reason(seq, token)
                if reason is not None:
                    seq.finish = reason
                    done.append(seq)
        if done:
            self._remove(done)

    def _stop_reason(self, seq: _Seq, token: int) -> dict[str, Any] | None:
        if token in seq.stop_ids:
            return {"type": "stop", "matched": token}
        if seq.params.stop:
            window = max(len(s) for s in seq.params.stop) + 8
            tail = self.tokenizer.decode(seq.out[-window:], skip_special_tokens=seq.params.skip_special_tokens)
            for stop in seq.params.stop:
                if stop and stop in tail:
                    return {"type": "stop", "matched": stop}
        if len(seq.out) >= seq.params.max_new_tokens:
            return {"type": "length", "length": len(seq.out)}
        if seq.cached + 1 >= self.max_len:  # prompt + output fill the context (SGLang's context_length)
            return {"type": "length", "length": len(seq.out)}
        return None

    def _remove(self, done: list[_Seq]) -> None:
        """Drop finished sequences from the live slots, filling holes with the last live slot."""
        gone = {id(s) for s in done}
        index = {id(s): i for i, s in enumerate(self._live)}
        for slot in sorted((index[id(s)] for s in done), reverse=True):
            last = len(self._live) - 1
            if slot != last:
                mover = self._live[last]
                self.backend.move(last, slot, mover.cached)
                self._live[slot] = mover
            self._live.pop()
        assert not any(id(s) in gone for s in self._live)
        for seq in done:
            self._finish(seq, seq.finish or {"type": "stop"})

    def _finish(self, seq: _Seq, reason: dict[str, Any]) -> None:
        seq.finish = reason
        seq.version = self.weight_version
        # A matched stop token stays in token_ids but not in the text, as SGLang's detokenizer
        # trims it (`trim_matched_stop`) whatever skip_special_tokens says: with
        # skip_special_tokens=False, or a stop id that is an ordinary token, the text showed it.
        ids = seq.out[:-1] if isinstance(reason.get("matched"), int) else seq.out
        text = self.tokenizer.decode(ids, skip_special_tokens=seq.params.skip_special_tokens)
        if isinstance(reason.get("matched"), str):
            cut = text.find(reason["matched"])
            if cut >= 0:
                text = text[:cut]
        seq.text = text
        try:
            seq.on_done(seq)
        except Exception:  # noqa: BLE001 - a closed event loop must not kill the worker
            log.exception("delivering a completion failed")

    # -- control ----------------------------------------------------------------------------

    def pause_sync(self, mode: PauseMode = "abort") -> int:
        """Pause generation; returns how many sequences were aborted or retracted."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"unknown pause mode {mode!r}")
        # Flag first, then take the step lock: the worker re-takes that lock right after releasing
        # it, and Python's locks are not fair, so a caller that only waited for the lock could wait
        # until every live sequence had finished. Flagged, the worker stops at its next turn.
        with self._wakeup:
            self._paused = True
        with self._lock:
            self._paused = True
            affected = 0
            if mode == "abort":
                with self._wakeup:
                    victims = [*self._live, *self._waiting]
                    self._live.clear()
                    self._waiting.clear()
                for seq in victims:
                    self._finish(seq, {"type": "abort", "message": "Abort by pause_generation."})
                affected = len(victims)
            elif mode == "retract":
                with self._wakeup:
                    retracted = list(self._live)
                    self._live.clear()
                    for seq in reversed(retracted):
                        seq.cached = 0
                        self._waiting.appendleft(seq)
                affected = len(retracted)
            return affected

    def resume_sync(self) -> None:
        with self._wakeup:
            self._paused = False
            self._wakeup.notify()
        self.backend.start_repack()  # weights loaded while paused: rebuild the fast copies now

    @property
    def paused(self) -> bool:
        return self._paused

    def num_running(self) -> int:
        return len(self._live) + len(self._waiting)

    def load_state_dict(self, tensors: dict[str, Any] | list[tuple[str, Any]], *, version: str | None) -> None:
        """Copy named HF tensors into the model in place (the fast path reads the same storage)."""
        import torch

        items = tensors.items() if isinstance(tensors, dict) else tensors
        params = self._weight_table()
        with self._lock, torch.no_grad():
            unknown = [name for name, _ in items if name not in params]
            if unknown:
                raise KeyError(f"unknown parameter names: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
            for name, tensor in items:
                target = params[name]
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} != model's {tuple(target.shape)}")
            self.backend.invalidate()
            for name, tensor in items:
                target = params[name]
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            self.backend.refresh(start=not self._paused)
            if version is not None:
                self.weight_version = str(version)

    def update_weights_from_disk_sync(self, path: str | Path, *, version: str | None = None) -> None:
        """Load every *.safetensors file of a HF folder (same architecture) into the running model.

        On CPU each tensor is read from the file straight into its live parameter (a cast goes
        through one tensor-sized buffer), so a push costs no host copy of the model; names and
        shapes are checked from the files' headers before any weight changes.
        """
        import torch
        from safetensors.torch import load_file

        from rlvr.weight_arena import read_safetensors_into, safetensors_header

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {path}")
        if self.device != "cpu":
            tensors: dict[str, Any] = {}
            for file in files:
                tensors.update(load_file(str(file)))
            self.load_state_dict(tensors, version=version)
            return
        params = self._weight_table()
        headers = [safetensors_header(file)[0] for file in files]
        unknown = [name for header in headers for name in header if name not in params]
        if unknown:
            raise KeyError(f"unknown parameter names: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
        for header in headers:
            for name, info in header.items():
                if tuple(info["shape"]) != tuple(params[name].shape):
                    raise ValueError(f"{name}: shape {tuple(info['shape'])} != model's {tuple(params[name].shape)}")
        with self._lock, torch.no_grad():
            self.backend.invalidate()
            read_safetensors_into(files, {name: param.detach() for name, param in params.items()})
            self.backend.refresh(start=not self._paused)
            if version is not None:
                self.weight_version = str(version)

    def load_lora_adapter_sync(self, path: str | Path, *, version: str | None = None) -> None:
        """Serve the base weights plus a peft LoRA adapter: W_base + (lora_alpha / r) * B @ A for
        every module it targets (`rlvr.server.lora_merge`), the base read from the folder this
        engine was started on; what the previous adapter merged and this one does not target goes
        back to the base (each load replaces, never stacks). The folder is checked against the
        base before any weight changes (a bad one raises `AdapterError` and sets no version). The
        merged tensors go in through `load_state_dict`, in buckets of `ADAPTER_BUCKET_BYTES`,
        under one hold of the step lock, so no step sees half of them; the version comes last.
        """
        from rlvr.server.lora_merge import AdapterMerge

        merge = AdapterMerge(path, self.model_path, previous=self._adapter_weights)
        table = self._weight_table()
        for name, shape in merge.shapes().items():  # the base folder must be this model's
            if name not in table or tuple(table[name].shape) != shape:
                raise ValueError(f"{self.model_path}: {name} {list(shape)} does not match the served model")
        dtype = self.model.dtype
        with self._lock:
            try:
                bucket: list[tuple[str, Any]] = []
                size = 0
                for name, tensor in merge.tensors(dtype=dtype, device=self.device):
                    bucket.append((name, tensor))
                    size += tensor.numel() * tensor.element_size()
                    if size >= ADAPTER_BUCKET_BYTES:
                        self.load_state_dict(bucket, version=None)
                        bucket, size = [], 0
                self.load_state_dict(bucket, version=version)
            except BaseException:
                # Part may be in: the next adapter load puts these back to the base as well.
                self._adapter_weights = self._adapter_weights | merge.merged
                raise
            self._adapter_weights = merge.merged

    def init_weights_update_group_sync(
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
        from rlvr.sync.group import join_group_like_sglang

        if group_name in self._weight_groups:
            raise ValueError(f"weight update group {group_name!r} already exists; destroy it first")
        self._weight_groups[group_name] = join_group_like_sglang(
            master_address=master_address,
            master_port=master_port,
            rank=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
            timeout_s=timeout_s,
        )

    def update_weights_from_distributed_sync(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str = "weight_update_group",
        version: str | None = None,
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> None:
        """Receive one bucket broadcast by group rank 0 straight into the live weights.

        Per-tensor format (`load_format=None`): a tensor whose name is a parameter (or
        buffer) of the same dtype and shape is received into that parameter's own storage:
        no allocation, no copy, and the fast path (whose fused Q/K/V and gate/up tensors
        *are* that storage) sees it at once. Anything else (a dtype cast, a non-contiguous
        parameter) is received into a reusable staging buffer and copied in.

        `"flattened_bucket"` (one uint8 broadcast of the bucket's bytes): the engine keeps
        its weights in one buffer in the trainer's send order (`_weight_arena`), so a
        bucket whose tensors lie back to back there is received into that byte range as
        is; any other bucket lands in a staging buffer and is copied in tensor by tensor.

        Tied weights share one parameter, so the name the trainer sends (the first one)
        updates every alias. A bad name or shape is found before any receive; the bucket
        is then drained into scratch (the collective must complete) and the model is left
        untouched. A broadcast that breaks midway leaves the bucket partly applied; the
        trainer then fails the engine or resends everything. The fast path's packed weight
        copies are rebuilt after a sync's last bucket (the one with `flush_cache` or a
        version), not after every bucket.
        """
        import torch

        from rlvr.sync.group import receive_into

        if not self.update_session:
            raise RuntimeError(
                "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
            )
        group = self._weight_groups.get(group_name)
        if group is None:
            raise KeyError(f"no weight update group {group_name!r}; call init_weights_update_group first")
        if not (len(names) == len(dtypes) == len(shapes)):
            raise ValueError(f"names/dtypes/shapes lengths differ: {len(names)}, {len(dtypes)}, {len(shapes)}")
        if load_format not in (None, "flattened_bucket"):
            raise ValueError(f"load_format {load_format!r} is not supported (None or 'flattened_bucket')")
        with self._lock, torch.no_grad():  # no step runs while half the weights are new
            if load_format == "flattened_bucket":
                target, copies, problems = self._flat_receive_target(names, dtypes, shapes)
                targets = [target]
            else:
                targets, copies, problems = self._receive_targets(names, dtypes, shapes)
            if not problems:
                self.backend.invalidate()
            receive_into(group, targets)
            if problems:
                raise ValueError(f"weight update refused ({len(problems)} bad tensors): {'; '.join(problems[:5])}")
            for param, staged in copies:
                param.copy_(staged)
            # Derived tensors once per sync, at its last bucket (or at end_weight_update), not per
            # bucket: the rebuild costs ~1 ms, between every two buckets of a push.
            self._derived_stale = not (flush_cache or version is not None)
            if not self._derived_stale:
                self.backend.refresh(start=not self._paused)
            if version is not None:
                self.weight_version = str(version)

    def _check_bucket(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> tuple[dict[str, Any], list[tuple[Any, tuple[int, ...]]], list[str]]:
        """The weight table, each tensor's (torch dtype, shape), and what is wrong with the bucket."""
        from rlvr.sync.group import torch_dtype

        table = self._weight_table()
        specs = [(torch_dtype(dt), tuple(int(s) for s in shape)) for dt, shape in zip(dtypes, shapes, strict=True)]
        problems: list[str] = []
        for name, (_, shape) in zip(names, specs, strict=True):
            param = table.get(name)
            if param is None:
                problems.append(f"unknown parameter name {name!r}")
            elif tuple(param.shape) != shape:
                problems.append(f"{name}: shape {shape} != model's {tuple(param.shape)}")
        return table, specs, problems

    def _flat_receive_target(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> tuple[Any, list[tuple[Any, Any]], list[str]]:
        """Where a flattened bucket lands: (uint8 receive target, (param, view) copies, problems)."""
        import torch

        table, specs, problems = self._check_bucket(names, dtypes, shapes)
        sizes = [dtype.itemsize * math.prod(shape) for dtype, shape in specs]
        total = sum(sizes)
        if not problems:
            params = [table[name].detach() for name in names]
            same_dtypes = all(p.dtype == dtype for p, (dtype, _) in zip(params, specs, strict=True))
            live = back_to_back_bytes(params) if same_dtypes else None
            if live is not None:
                return live, [], []  # the bucket's bytes are the weights' own bytes: no copy
        staging = self._staging.get(("flat", self.device))
        if staging is None or staging[0].numel() < total:
            staging = [torch.empty(total, dtype=torch.uint8, device=self.device)]
            self._staging[("flat", self.device)] = staging
        flat = staging[0][:total]
        if problems:
            return flat, [], problems
        copies: list[tuple[Any, Any]] = []
        offset = 0
        for name, (dtype, shape), size in zip(names, specs, sizes, strict=True):
            copies.append((table[name], flat[offset : offset + size].view(dtype).view(shape)))
            offset += size
        return flat, copies, []

    def _receive_targets(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> tuple[list[Any], list[tuple[Any, Any]], list[str]]:
        """Where each tensor of a bucket lands: (receive targets in order, (param, staging) copies, problems)."""
        import torch

        table, specs, problems = self._check_bucket(names, dtypes, shapes)
        if problems:  # drain the bucket into scratch so the collective completes, touch nothing
            return [torch.empty(shape, dtype=dtype, device=self.device) for dtype, shape in specs], [], problems
        targets: list[Any] = []
        copies: list[tuple[Any, Any]] = []
        used: dict[tuple[Any, ...], int] = {}
        for name, (dtype, shape) in zip(names, specs, strict=True):
            param = table[name]
            if param.dtype == dtype and param.is_contiguous():
                targets.append(param.detach())  # same storage: the broadcast writes the live weight
                continue
            key = (dtype, shape, param.device)
            index = used.get(key, 0)
            used[key] = index + 1
            pool = self._staging.setdefault(key, [])
            if index == len(pool):
                pool.append(torch.empty(shape, dtype=dtype, device=param.device))
            targets.append(pool[index])
            copies.append((param, pool[index]))
        return targets, copies, problems

    def _weight_table(self) -> dict[str, Any]:
        """Every HF state_dict name (tied aliases included) -> its live parameter or buffer.

        Kept for a weight-update session (walking the modules costs ~2 ms at 36 layers, once
        per bucket otherwise); the model's parameters do not change identity inside one."""
        if self._session_table is not None and self.update_session:
            return self._session_table
        table: dict[str, Any] = dict(self.model.named_parameters(remove_duplicate=False))
        table.update(self.model.named_buffers(remove_duplicate=False))
        self._session_table = table if self.update_session else None
        return table

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        """Leave a group (as SGLang: an unknown name is an error)."""
        group = self._weight_groups.pop(group_name, None)
        if group is None:
            raise KeyError("The group to be destroyed does not exist.")
        group.shutdown()

    def begin_weight_update_sync(self) -> None:
        """Open a weight-update session (SGLang 0.5.23 refuses a second one)."""
        if self.update_session:
            raise RuntimeError("a weight-update session is already open; call end_weight_update() first")
        self._session_table = None
        self.update_session = True

    def end_weight_update_sync(self) -> None:
        if not self.update_session:
            raise RuntimeError("no weight-update session is open; call begin_weight_update() first")
        self.update_session = False
        self._session_table = None
        if self._derived_stale:  # no bucket of this session said it was the last
            with self._lock:
                self.backend.refresh(start=not self._paused)
            self._derived_stale = False

    def close(self) -> None:
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
        self._thread.join(timeout=10)
        if self.backend is not None:
            self.backend.close()  # no packer thread left running into interpreter exit (see its docstring)

    # -- the async Protocol -----------------------------------------------------------------

    async def pause(self, mode: PauseMode = "abort") -> None:
        await asyncio.to_thread(self.pause_sync, mode)

    async def resume(self) -> None:
        self.resume_sync()

    async def update_weights_from_disk(self, path: str, *, version: int | None = None) -> None:
        await asyncio.to_thread(
            self.update_weights_from_disk_sync, path, version=None if version is None else str(version)
        )

    async def load_lora_adapter(self, path: str, *, version: int | None = None) -> None:
        await asyncio.to_thread(self.load_lora_adapter_sync, path, version=None if version is None else str(version))

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
    ) -> None:
        await asyncio.to_thread(
            self.init_weights_update_group_sync,
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        )

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str = "weight_update_group",
        version: int | None = None,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> None:
        # No prefix cache to flush (every prefill is fresh); flush_cache marks a sync's last bucket.
        await asyncio.to_thread(
            self.update_weights_from_distributed_sync,
            names,
            dtypes,
            shapes,
            group_name=group_name,
            version=None if version is None else str(version),
            load_format=load_format,
            flush_cache=flush_cache,
        )

    async def begin_weight_update(self) -> None:
        self.begin_weight_update_sync()

    async def end_weight_update(self) -> None:
        self.end_weight_update_sync()

    async def health(self) -> bool:
        return self.worker_alive

    @property
    def worker_alive(self) -> bool:
        return self._thread.is_alive() and self._error is None

    # -- colocation (rollout.colocate): the trainer on this GPU trains while the cache is gone --

    def release_kv_cache(self) -> None:
        """Abort what runs, stay paused, and free the KV cache (the decoder and its buffers) for
        the trainer that shares this GPU; the weights stay, and the next push replaces them."""
        self.pause_sync("abort")
        with self._lock:
            if self.backend is not None:
                self.backend.wait_packed()  # no packer thread left writing into what is dropped
                self._fast_backend = type(self.backend).__name__ != "RecomputeDecoder"
                released: Any = None  # typed Any: the rest of the class calls the backend unchecked
                self.backend = released
        if str(self.device).startswith("cuda"):
            import torch

            torch.cuda.empty_cache()  # cached blocks are memory the trainer cannot use

    def resume_kv_cache(self) -> None:
        """Allocate the KV cache again (the same way as at start) and continue generating."""
        with self._lock:
            if self.backend is None:
                self.backend = self._make_backend(getattr(self, "_fast_backend", True))
        self.resume_sync()
