"""Weight sync by collective broadcast: trainer rank 0 -> every rollout engine rank, SGLang's protocol.

The group is {trainer rank 0 (hosts the TCPStore), every engine rank}, gloo on CPU and NCCL on
GPU, built as SGLang builds its member, so SGLang, vLLM (rlvr's backend) and `rlvr serve` share
this one code path. A push is a weight-update session (pause -> flush -> begin -> buckets -> end
-> continue), in the engines' dtype, the version on the last bucket. This module orchestrates a
push and agrees each step's outcome across trainer ranks; `membership` keeps the group,
`buckets` plans and packs what travels, `send` pipelines the buckets onto the wire. Why it is
ordered and what it costs: docs/weight-sync.md.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from rlvr.sync.base import Decision, EngineFailure, SyncError, agree
from rlvr.sync.buckets import BucketPlan, Weights
from rlvr.sync.engine_calls import EngineCalls, EngineFactory
from rlvr.sync.membership import GroupMembership, JoinGroup, engine_layout
from rlvr.sync.send import WIRE_FORMATS, BucketSender
from rlvr.sync.verify import PushVerifier

if TYPE_CHECKING:
    import torch
    from torch import nn

    from rlvr.sync.base import TensorSpec

log = logging.getLogger(__name__)


def _urls(failures: list[EngineFailure]) -> set[str]:
    return {f.url for f in failures}


class BroadcastSync:
    """`WeightSync` over a {trainer rank 0, engine ranks} broadcast group (see the module docstring).

    Every trainer rank constructs it and calls `push`; `client` (an `SGLangClient`) is needed
    on rank 0 only. `dtype` casts on the wire (e.g. bf16 engines); `engine_factory(url)` and
    `join` are seams for tests. `verify` (auto | on | off): compare every engine's fingerprint of
    what it serves with what was sent, after the last bucket (`rlvr.sync.verify`).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        client: object = None,
        timeout_s: float = 600.0,
        bucket_mb: float = 256,
        on_engine_failure: str = "fail",
        dtype: torch.dtype | None = None,
        backend: str | None = None,
        master_address: str | None = None,
        group_name: str = "rlvr_weights",
        pause_mode: str = "abort",
        wire_format: str = "flattened_bucket",
        engine_factory: EngineFactory | None = None,
        join: JoinGroup | None = None,
        verify: str = "auto",
    ):
        import torch

        from rlvr.trainer import dist as d

        self.model = model
        self.rank = d.rank()
        self.timeout_s = float(timeout_s)
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.device = "cpu" if self.backend == "gloo" else None
        self.forced_dtype = dtype
        self.plan = BucketPlan(
            model, bucket_mb=bucket_mb, wire_dtype=None if dtype is None else str(dtype).removeprefix("torch.")
        )
        self.pause_mode = pause_mode
        self.verifier = PushVerifier(model, mode=verify)
        if self.verifier.enabled:
            self.plan.observe = self.verifier.add
        if wire_format not in WIRE_FORMATS:
            raise ValueError(f"wire_format must be 'flattened_bucket' or 'per_tensor', got {wire_format!r}")
        self.calls: EngineCalls | None = None
        self.membership: GroupMembership | None = None
        self.sender: BucketSender | None = None
        if self.rank == 0:
            if client is None:
                raise ValueError("BroadcastSync needs the rollout client on trainer rank 0")
            self.calls = EngineCalls(client, timeout_s=timeout_s, on_failure=on_engine_failure, factory=engine_factory)
            self.membership = GroupMembership(
                self.calls,
                group_name=group_name,
                backend=self.backend,
                timeout_s=self.timeout_s,
                master_address=master_address,
                join=join,
            )
            self.sender = BucketSender(
                self.calls,
                self.plan,
                self.membership,
                backend=self.backend,
                wire_format=wire_format,
                timeout_s=self.timeout_s,
            )
        self._fatal: str | None = None

    @property
    def buckets(self) -> list[list[TensorSpec]]:
        """The planned buckets, in the current wire dtype."""
        return self.plan.buckets

    # -- the Protocol --------------------------------------------------------------------

    def push(self, *, version: int) -> dict[str, float]:
        """Collective: pause -> flush -> broadcast every bucket -> resume; returns metrics on every rank."""

        start = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            decision = agree(self._prepare(version, recover=attempts == 1) if self.rank == 0 else None)
            if decision.wire_dtype != self.plan.wire_dtype:
                self.plan.replan(decision.wire_dtype)
            transfer_start = time.monotonic()
            failures = self._transfer(version)
            transfer_s = time.monotonic() - transfer_start
            decision = agree(self._finish(version, failures) if self.rank == 0 else None)
            if decision.state == "ok":
                break
        total_bytes = self.plan.total_bytes
        return {
            "sync/seconds": time.monotonic() - start,
            "sync/transfer_seconds": transfer_s,
            "sync/gb": total_bytes / 1e9,
            "sync/gb_per_s": total_bytes / 1e9 / max(transfer_s, 1e-9),
            "sync/buckets": float(len(self.plan.buckets)),
            "sync/engines": float(decision.engines),
            "sync/dropped_engines": float(decision.dropped),
            "sync/attempts": float(attempts),
            "sync/verify_s": float(decision.verify_s),
            "sync/verified_engines": float(decision.verified),
            "sync/version": float(version),
        }

    def close(self) -> None:
        if self.membership is not None:
            self.membership.drop()
        if self.calls is not None:
            self.calls.close()

    def _rank0(self) -> tuple[EngineCalls, GroupMembership]:
        calls, membership = self.calls, self.membership
        assert calls is not None and membership is not None
        return calls, membership

    # -- rank 0: before the transfer -----------------------------------------------------

    def _prepare(self, version: int, *, recover: bool = True) -> Decision:
        """Rank 0: (re)build the group if membership changed, then pause, flush and begin on every engine."""
        calls, membership = self._rank0()
        try:
            if recover:  # once per push: an engine dropped by this push does not rejoin it
                calls.recover()
            for _ in range(len(calls.live()) + 2):
                members = calls.live()
                if not members and not (calls.on_failure == "continue" and calls.await_rejoin()):
                    raise SyncError(f"weight sync to version {version}: no live rollout engine")
                members = calls.live()
                failures = calls.unhealthy(members)
                if failures:
                    calls.handle(failures, version=version)
                    continue
                if not membership.serves(members, calls):
                    failures = self._rebuild(members)
                    if failures:
                        calls.handle(failures, version=version)
                        continue
                failures = self._open_session(members)
                if failures:
                    self._end([m for m in members if m not in _urls(failures)])
                    calls.handle(failures, version=version)
                    continue
                return Decision("go", wire_dtype=self.plan.wire_dtype)
            raise SyncError(f"weight sync to version {version}: engines kept failing during setup")
        except SyncError as exc:
            return Decision.failed(exc)
        except Exception as exc:  # noqa: BLE001 - every rank must learn that rank 0 failed
            log.exception("weight sync setup failed")
            return Decision.failed(SyncError(f"weight sync to version {version} failed on trainer rank 0: {exc!r}"))

    def _rebuild(self, members: list[str]) -> list[EngineFailure]:
        """Create a fresh group with `members` in the engines' dtype; returns the engines that failed to join."""
        calls, membership = self._rank0()
        membership.drop()
        membership.free_stale(members)
        layout = engine_layout(calls, members, self.model)
        if layout.failures:
            return layout.failures
        if self.forced_dtype is None and layout.dtype is not None and layout.dtype != self.plan.wire_dtype:
            self.plan.replan(layout.dtype)
        return membership.join(members, layout.ranks)

    def _open_session(self, members: list[str]) -> list[EngineFailure]:
        """Pause and flush every engine, then open its weight-update session."""
        calls, _ = self._rank0()
        failures = calls.call(members, "pause", "pause", self.pause_mode)
        ok = [m for m in members if m not in _urls(failures)]
        failures += calls.call(ok, "flush", "flush_cache")
        ok = [m for m in ok if m not in _urls(failures)]
        return failures + self._begin(ok)

    def _begin(self, members: list[str]) -> list[EngineFailure]:
        """Open the weight-update session; one left open by a failed push is ended and reopened."""
        calls, _ = self._rank0()
        failures = calls.call(members, "begin_weight_update", "begin_weight_update")
        stale = [f.url for f in failures if "already open" in f.error]
        if stale:
            calls.call(stale, "end_weight_update", "end_weight_update")
            retried = calls.call(stale, "begin_weight_update", "begin_weight_update")
            failures = [f for f in failures if f.url not in stale] + retried
        return failures

    def _end(self, members: list[str]) -> list[EngineFailure]:
        calls, _ = self._rank0()
        return calls.call(members, "end_weight_update", "end_weight_update") if members else []

    # -- every rank: the transfer --------------------------------------------------------

    def _weights(self) -> Weights:
        from rlvr.trainer.weights import iter_full_weights

        return iter_full_weights(self.model, dtype=None, device=self.device)

    def _transfer(self, version: int) -> list[EngineFailure]:
        """Gather every tensor (all ranks, lockstep); rank 0 also broadcasts. Returns rank 0's failures."""
        weights = self._weights()
        if self.sender is None:
            for _ in weights:
                pass
            return []
        failures: list[EngineFailure] = []
        self._fatal = None
        self.verifier.start()
        try:
            failures = self.sender.send(weights, version)
        except Exception as exc:  # noqa: BLE001 - every rank must learn that rank 0 failed
            log.exception("weight sync transfer failed")
            self._rank0()[1].drop()
            self._fatal = f"weight sync to version {version} failed on trainer rank 0: {exc!r}"
        finally:
            for _ in weights:  # keep the other trainer ranks' all-gathers company after a failure
                pass
        return failures

    # -- rank 0: after the transfer ------------------------------------------------------

    def _finish(self, version: int, failures: list[EngineFailure]) -> Decision:
        calls, membership = self._rank0()
        try:
            members = list(membership.members) or calls.live()
            if self._fatal:
                self._end([m for m in members if m not in _urls(failures)])
                raise SyncError(self._fatal)
            if failures:
                self._end([m for m in members if m not in _urls(failures)])
                calls.handle(failures, version=version)  # raises in fail mode
                return Decision("retry")
            failures = self._end(members)
            ok = [m for m in members if m not in _urls(failures)]
            failures += self.verifier.check(calls, ok)  # before resume: a bad engine never serves
            ok = [m for m in members if m not in _urls(failures)]
            failures += calls.call(ok, "resume", "resume")
            calls.handle(failures, version=version)
            calls.admit_rejoined()
            engines, dropped = len(calls.live()), len(calls.dropped)
            return Decision(
                "ok", engines=engines, dropped=dropped, verify_s=self.verifier.seconds, verified=self.verifier.verified
            )
        except SyncError as exc:
            return Decision.failed(exc)
