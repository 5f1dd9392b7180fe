"""Rank 0's half of a broadcast push: each bucket's request to the rollout engines, then its broadcast.

A flattened bucket is one uint8 broadcast; rank 0 packs bucket k+1 while bucket k is on the wire
and, on gloo, sends bucket k+1's request before the engines answer bucket k (gloo's transport
keeps the order), so an engine never idles an HTTP round trip per bucket. Per-tensor sends one
broadcast per tensor. A broken broadcast tears the group down, so healthy receivers stop
waiting, and the engines to blame are those that lost their health, else those that never answered.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, TypedDict

from rlvr.sync.base import EngineFailure
from rlvr.sync.buckets import BucketPlan, Weights, next_weight
from rlvr.sync.engine_calls import EngineCalls, Futures
from rlvr.sync.membership import BroadcastGroup, GroupMembership, Work, abort

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch import Tensor

WIRE_FORMATS = ("flattened_bucket", "per_tensor")


class _LoadFormat(TypedDict, total=False):
    """The flattened format's extra field of a bucket request."""

    load_format: str


def merge(failures: list[EngineFailure], more: list[EngineFailure]) -> list[EngineFailure]:
    """`failures` plus those of `more` whose engine is not named yet (one failure per engine)."""
    named = {f.url for f in failures}
    return failures + [f for f in more if f.url not in named]


class BucketSender:
    """Sends every bucket of `plan` to the members of `membership`'s group, as `wire_format` says."""

    def __init__(
        self,
        calls: EngineCalls,
        plan: BucketPlan,
        membership: GroupMembership,
        *,
        backend: str,
        wire_format: str,
        timeout_s: float,
    ) -> None:
        self.calls = calls
        self.plan = plan
        self.membership = membership
        self.backend = backend
        self.wire_format = wire_format
        self.timeout_s = timeout_s

    def send(self, weights: Weights, version: int) -> list[EngineFailure]:
        """Every bucket, `version` on the last; returns the engines that failed (the group is then dropped)."""
        if self.wire_format == "flattened_bucket":
            return self._send_flat(weights, version)
        return self._send_per_tensor(weights, version)

    def _request(self, index: int, version: int, *, flattened: bool) -> Futures:
        """Send bucket `index`'s `/update_weights_from_distributed` to every member; returns the futures."""
        bucket = self.plan.buckets[index]
        last = index == len(self.plan.buckets) - 1
        extra: _LoadFormat = {"load_format": "flattened_bucket"} if flattened else {}
        return self.calls.submit(
            list(self.membership.members),
            "update_weights_from_distributed",
            [s.name for s in bucket],
            [s.dtype for s in bucket],
            [list(s.shape) for s in bucket],
            group_name=self.membership.label,
            version=version if last else None,
            flush_cache=last,
            **extra,
        )

    def _wire(self) -> tuple[BroadcastGroup, list[str], dist.BroadcastOptions, timedelta]:
        """What a send needs: the group, its members, root-0 broadcast options, the wait."""
        import torch.distributed as dist

        group = self.membership.group
        assert group is not None
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return group, list(self.membership.members), options, timedelta(seconds=self.timeout_s)

    def _send_flat(self, weights: Weights, version: int) -> list[EngineFailure]:
        """Flattened buckets, two in flight on gloo (see the module docstring).

        Per bucket i: pack it (bucket i-1 is on the wire meanwhile), wait until bucket i-1's
        broadcast is done, collect the answers up to bucket i-2 (gloo; up to i-1 on NCCL),
        then send bucket i's request, start its broadcast and fingerprint it (verify) while it travels.
        """
        group, members, options, wait = self._wire()
        ahead = 1 if self.backend == "gloo" else 0  # requests left unanswered when the next one leaves
        pending: list[tuple[int, Futures]] = []  # requests sent, answers not collected, in bucket order
        work: Work | None = None  # the broadcast of pending[-1]

        def answers(keep: int) -> list[EngineFailure]:
            """Collect the oldest answers until `keep` requests remain (one deadline for all)."""
            failures: list[EngineFailure] = []
            deadline = time.monotonic() + self.timeout_s
            while len(pending) > keep:
                index, futures = pending.pop(0)
                left = max(0.0, deadline - time.monotonic())
                failures = merge(failures, self.calls.collect(futures, self.plan.stage_name(index), timeout_s=left))
            return failures

        def fail(failures: list[EngineFailure], error: BaseException | None) -> list[EngineFailure]:
            if error is not None:
                abort(group)  # receivers blocked on a bucket fail now, so their answers come back
            failures = merge(failures, answers(0))
            self.membership.drop()
            return self._culprits(members, failures, error)

        def landed(keep: int) -> list[EngineFailure]:
            """Wait for the newest broadcast, then collect answers until `keep` remain."""
            if work is not None:
                try:
                    work.wait(wait)
                except BaseException as exc:  # noqa: BLE001 - a broken collective is an engine failure to attribute
                    return fail([], exc)
            failures = answers(keep)
            return fail(failures, None) if failures else []

        for index, bucket in enumerate(self.plan.buckets):
            flat = self.plan.pack(weights, bucket, slot=index % 2)  # overlaps bucket index-1 on the wire
            failures = landed(ahead)
            if failures:
                return failures
            pending.append((index, self._request(index, version, flattened=True)))
            try:
                work = group.broadcast([flat], options)
            except BaseException as exc:  # noqa: BLE001 - attributed like a broken broadcast
                return fail([], exc)
            self.plan.observe_flat(bucket, flat)  # the verify fingerprint, while the bucket travels
        return landed(0)

    def _send_per_tensor(self, weights: Weights, version: int) -> list[EngineFailure]:
        group, members, options, wait = self._wire()
        for index, bucket in enumerate(self.plan.buckets):
            futures = self._request(index, version, flattened=False)
            error: BaseException | None = None
            works: list[tuple[Work, Tensor]] = []  # each tensor stays referenced until its broadcast is done
            offsets: dict[str, int] = {}
            try:
                for spec in bucket:
                    tensor = self.plan.stage(next_weight(weights, spec), spec, offsets)
                    works.append((group.broadcast([tensor], options), tensor))
                for work, _ in works:
                    work.wait(wait)
            except BaseException as exc:  # noqa: BLE001 - a broken collective is an engine failure to attribute
                error = exc
                abort(group)  # receivers blocked on the rest of the bucket fail now
            failures = self.calls.collect(futures, self.plan.stage_name(index))
            if error is not None or failures:
                self.membership.drop()
                return self._culprits(members, failures, error)
        return []

    def _culprits(
        self, members: list[str], failures: list[EngineFailure], error: BaseException | None
    ) -> list[EngineFailure]:
        """Which engines to blame. A broken broadcast makes healthy receivers fail too (rank 0
        tore the group down), so blame those that no longer answer /health, else those that
        never answered, else every failure."""
        if error is None:
            return failures
        detail = f"broadcast failed: {type(error).__name__}: {error}"
        suspects = failures or [EngineFailure(u, "update_weights_from_distributed", detail) for u in members]
        healthy = self.calls.healthy([f.url for f in suspects])
        dead = [
            EngineFailure(f.url, f.stage, f"{f.error} (no /health; {detail})") for f in suspects if f.url not in healthy
        ]
        silent = [f for f in suspects if "no answer within" in f.error]
        return dead or silent or suspects
