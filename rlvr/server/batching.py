"""The embedded engine's continuous batching: one worker thread steps the model's KV slots.

Each iteration holds the step lock for one prefill-or-decode step, so control calls (pause, weight
loads) land between steps and never see half-updated state. Waiting sequences are admitted while
there is room (the n samples of a prompt share one prefill), and a finished one leaves at once, so
the batch never carries dead rows. Pause modes mirror SGLang's. docs/engines.md ("Inside the
embedded engine").
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from rlvr.rollout.base import PauseMode
from rlvr.server.sequences import Seq, finished_text, stop_reason

log = logging.getLogger(__name__)

SMALL_HIDDEN = 256


def default_threads(model: Any, device: str, available: int) -> int:
    """Intra-op threads for the engine's worker thread.

    Why not always torch's default: the engine steps on its own thread, and there splitting small
    ops across OpenMP threads costs more than it saves for narrow models, while wide ones need
    every core (docs/engines.md, "Tests and speed of the embedded engine"). So CPU models narrower
    than `SMALL_HIDDEN` get one thread; `threads=` overrides.
    """
    hidden = int(getattr(model.config, "hidden_size", 0) or 0)
    if device == "cpu" and 0 < hidden < SMALL_HIDDEN:
        return 1
    return available


class Scheduler:
    """Admits, prefills, decodes, samples and finishes sequences on its own worker thread.

    `backend` is the decoder that owns the KV slots (None while the KV cache is released);
    `weight_version` stamps every sequence that finishes. Both change only under `step_lock`.
    """

    def __init__(
        self,
        backend: Any,
        *,
        tokenizer: Any,
        max_batch: int,
        max_len: int,
        max_prefill_tokens: int,
        original_logprobs: bool,
        weight_version: str,
        threads: int,
    ):
        self.backend = backend
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.max_len = max_len
        self.max_prefill_tokens = max_prefill_tokens
        self.original_logprobs = original_logprobs
        self.weight_version = weight_version
        self.threads = threads  # OpenMP thread counts are per thread: the worker sets its own
        self.step_lock = threading.RLock()  # held for one step; control calls take it between steps
        self.error: BaseException | None = None
        self._wakeup = threading.Condition(threading.Lock())
        self._waiting: deque[Seq] = deque()
        self._live: list[Seq] = []
        self._to_abort: list[Seq] = []
        self._paused = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rlvr-embedded-engine", daemon=True)
        self._thread.start()

    # -- what callers see -----------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def live(self) -> Sequence[Seq]:
        """The sequences in KV slots now, in slot order (read only)."""
        return self._live

    def num_running(self) -> int:
        return len(self._live) + len(self._waiting)

    def submit(self, seqs: list[Seq]) -> None:
        if self.error is not None:
            raise RuntimeError(f"embedded engine worker died: {self.error!r}")
        with self._wakeup:
            self._waiting.extend(seqs)
            self._wakeup.notify()

    def abort(self, seqs: Sequence[Seq]) -> None:
        """Ask the worker to drop these sequences at its next step (they finish with "abort")."""
        with self._wakeup:
            self._to_abort.extend(seqs)
            self._wakeup.notify()

    def pause(self, mode: PauseMode = "abort") -> int:
        """Pause generation; returns how many sequences were aborted or retracted."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"unknown pause mode {mode!r}")
        # Flag first, then take the step lock: the worker re-takes that lock right after releasing
        # it, and Python's locks are not fair, so a caller that only waited for the lock could wait
        # until every live sequence had finished. Flagged, the worker stops at its next turn.
        with self._wakeup:
            self._paused = True
        with self.step_lock:
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

    def resume(self) -> None:
        with self._wakeup:
            self._paused = False
            self._wakeup.notify()
        self.backend.start_repack()  # weights loaded while paused: rebuild the fast copies now

    def close(self) -> None:
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
        self._thread.join(timeout=10)
        if self.backend is not None:
            self.backend.close()  # no packer thread left running into interpreter exit (see its docstring)

    # -- the worker loop ------------------------------------------------------------------------

    def _run(self) -> None:
        import torch

        torch.set_num_threads(self.threads)
        try:
            while True:
                with self._wakeup:
                    while (
                        not self._closed and not self._to_abort and (self._paused or not (self._waiting or self._live))
                    ):
                        self._wakeup.wait()
                    if self._closed:
                        return
                with self.step_lock:
                    self._drop_aborted()  # even while paused: a cancelled request frees its slot now
                    if not self._paused:
                        self._step()
        except BaseException as exc:  # noqa: BLE001 - a dead worker must fail every waiter, not hang them
            log.exception("embedded engine worker died")
            self.error = exc
            with self.step_lock:
                for seq in [*self._live, *self._waiting]:
                    self._finish(seq, {"type": "abort", "message": f"engine error: {exc!r}"})
                self._live.clear()
                self._waiting.clear()

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

    def _take_waiting(self) -> list[Seq]:
        """The waiting sequences that fit the free slots and the prefill token budget, in order."""
        free = self.max_batch - len(self._live)
        if free <= 0:
            return []
        with self._wakeup:
            batch: list[Seq] = []
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
        return batch

    def _admit(self) -> bool:
        batch = self._take_waiting()
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
        placed: list[Seq] = [batch[0]] * len(batch)
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

    def _sample_and_check(self, seqs: list[Seq], logits: Any) -> None:
        from rlvr.server.sampling import sample_next

        params = [s.params for s in seqs]
        tokens, logprobs = sample_next(logits, params, [s.rng for s in seqs], original=self.original_logprobs)
        done: list[Seq] = []
        max_len = self.max_len
        for seq, token, logprob in zip(seqs, tokens, logprobs, strict=True):
            seq.out.append(token)
            seq.logprobs.append(logprob)
            # The common case (no stop hit, room left) in one line; `stop_reason` says which stop it was.
            if (
                token in seq.stop_ids
                or seq.params.stop
                or len(seq.out) >= seq.params.max_new_tokens
                or seq.cached + 1 >= max_len
            ):
                reason = stop_reason(seq, token, tokenizer=self.tokenizer, max_len=max_len)
                if reason is not None:
                    seq.finish = reason
                    done.append(seq)
        if done:
            self._remove(done)

    def _remove(self, done: list[Seq]) -> None:
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

    def _finish(self, seq: Seq, reason: dict[str, Any]) -> None:
        seq.finish = reason
        seq.version = self.weight_version
        seq.text = finished_text(seq, reason, tokenizer=self.tokenizer)
        try:
            seq.on_done(seq)
        except Exception:  # noqa: BLE001 - a closed event loop must not kill the worker
            log.exception("delivering a completion failed")
