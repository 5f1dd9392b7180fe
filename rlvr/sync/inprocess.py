"""Weight sync into an `EmbeddedEngine` living in the trainer's own process (rank 0).

Colocated runs (the CPU quickstart, one-GPU debugging) need no group, no HTTP and no
serialisation: gathered tensors are copied straight into the engine's parameters with
its `load_state_dict` (which holds the engine's step lock, so no decode step sees half
new weights). Under FSDP2 the copy goes in buckets of `bucket_mb`, so rank 0 never holds
a second full model; the version is set with the last bucket. Before resuming, the engine's
fingerprint of what it serves is compared with what was copied (`sync.verify`).
"""

from __future__ import annotations

import time
from typing import Any

from rlvr.bridge import run_blocking
from rlvr.sync.base import MB, SyncError
from rlvr.sync.verify import PushVerifier, mismatch


class InProcessSync:
    """`WeightSync` for an in-process engine (`engine` on trainer rank 0; None elsewhere)."""

    def __init__(
        self,
        model: Any,
        *,
        engine: Any = None,
        bucket_mb: float = 256,
        dtype: Any = None,
        pause_mode: str = "abort",
        verify: str = "auto",
    ):
        from rlvr.trainer import dist as d

        self.model = model
        self.rank = d.rank()
        if self.rank == 0 and engine is None:
            raise ValueError("InProcessSync needs the in-process engine on trainer rank 0")
        self.engine = engine if self.rank == 0 else None
        self.limit = int(bucket_mb * MB)
        self.dtype = dtype
        self.pause_mode = pause_mode
        self.verifier = PushVerifier(model, mode=verify)
        if verify == "auto" and not hasattr(self.engine, "weights_fingerprint"):
            self.verifier = PushVerifier(model, mode="off")

    def push(self, *, version: int) -> dict[str, float]:
        from rlvr.trainer.weights import iter_full_weights

        start = time.monotonic()
        engine = self.engine
        device = getattr(engine, "device", "cpu") if engine is not None else None
        total = 0
        if engine is not None:
            run_blocking(engine.pause(self.pause_mode))
        copied = 0
        self.verifier.start()
        served_dtype = getattr(getattr(engine, "model", None), "dtype", None)  # what the engine casts to
        try:
            bucket: list[tuple[str, Any]] = []
            size = 0
            for name, tensor in iter_full_weights(self.model, dtype=self.dtype, device=device):
                if engine is None:
                    continue
                bucket.append((name, tensor))
                if self.verifier.enabled:
                    same = served_dtype is None or tensor.dtype == served_dtype
                    self.verifier.add(name, tensor if same else tensor.to(served_dtype))
                size += tensor.numel() * tensor.element_size()
                total += tensor.numel() * tensor.element_size()
                if size >= self.limit:
                    engine.load_state_dict(bucket, version=None)
                    copied += len(bucket)
                    bucket, size = [], 0
            if engine is not None:
                engine.load_state_dict(bucket, version=str(version))
        except Exception as exc:
            # Part of the new weights may be in: the engine stays paused (it would serve a mix of
            # two versions under the old tag) and the loop stops with a checkpoint.
            raise SyncError(f"weight sync to version {version} failed after {copied} tensors: {exc!r}") from exc
        if engine is not None:
            self._verify(engine, version)  # a failure leaves the engine paused, as above
            run_blocking(engine.resume())
        seconds = time.monotonic() - start
        return {
            "sync/seconds": seconds,
            "sync/gb": total / 1e9,
            "sync/gb_per_s": total / 1e9 / max(seconds, 1e-9),
            "sync/verify_s": self.verifier.seconds,
            "sync/verified_engines": float(self.verifier.verified),
            "sync/version": float(version),
        }

    def _verify(self, engine: Any, version: int) -> None:
        if not self.verifier.enabled:
            return
        sent = self.verifier.sent()
        start = time.monotonic()
        try:
            served: object = run_blocking(engine.weights_fingerprint())
        except Exception as exc:  # noqa: BLE001 - reported as the failed push it is
            served = exc
        self.verifier.seconds += time.monotonic() - start
        failure = mismatch("in-process engine", sent, served)
        if failure is not None:
            raise SyncError(f"weight sync to version {version} failed: {failure}", [failure])
        self.verifier.verified = 1

    def close(self) -> None:
        pass
