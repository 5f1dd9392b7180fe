"""Weight sync by collective broadcast: trainer rank 0 -> every engine rank, SGLang's protocol.

The group is {trainer rank 0 (hosts the TCPStore), every engine rank}, gloo on CPU and NCCL on
GPU, built as SGLang builds its member, so SGLang, vLLM (rlvr's backend) and `rlvr serve` share
this one code path. A push is a weight-update session (pause -> flush -> begin -> buckets -> end
-> continue), in the engines' dtype, the version on the last bucket. Each bucket is one uint8
broadcast of its tensors' bytes (`flattened_bucket`, default) or one broadcast per tensor. Rank 0
packs bucket k+1 into the second of two buffers while bucket k is on the wire, and on gloo sends
its request before the engines answer bucket k (gloo's transport keeps the order), so an engine
never idles an HTTP round trip per bucket. A broken broadcast tears the group down, so healthy
receivers stop waiting. Why it is ordered and what it costs: docs/weight-sync.md.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from rlvr.process import free_port
from rlvr.sync.base import EngineFailure, SyncError, TensorSpec, agree, plan_buckets, weight_specs
from rlvr.sync.engines import Engines
from rlvr.weight_arena import back_to_back_bytes

log = logging.getLogger(__name__)

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def reachable_address(urls: list[str]) -> str:
    """The address engines can reach this process at: loopback if they are all local, else
    the interface the OS routes to the first remote engine through (no packet is sent).
    `RLVR_SYNC_MASTER_ADDR` overrides."""
    if os.environ.get("RLVR_SYNC_MASTER_ADDR"):
        return os.environ["RLVR_SYNC_MASTER_ADDR"]
    remote = [u for u in urls if (urlparse(u).hostname or "127.0.0.1") not in LOOPBACK]
    if not remote:
        return "127.0.0.1"
    parsed = urlparse(remote[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((parsed.hostname, parsed.port or 80))
        return sock.getsockname()[0]


def engine_dtype(name: str, model: Any) -> str:
    """An engine's dtype name ("bfloat16", "torch.float16", "auto") as a wire dtype ("" if unknown);
    "auto" is the model config's."""
    name = name.removeprefix("torch.")
    if name == "auto":
        config = getattr(model, "config", None)
        value = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None)
        name = str(value).removeprefix("torch.") if value is not None else ""
    aliases = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
    name = aliases.get(name, name)
    return name if name in ("float32", "bfloat16", "float16") else ""


def _merge(failures: list[EngineFailure], more: list[EngineFailure]) -> list[EngineFailure]:
    """`failures` plus those of `more` whose engine is not named yet (one failure per engine)."""
    named = {f.url for f in failures}
    return failures + [f for f in more if f.url not in named]


def _abort(group: Any) -> None:
    """Close rank 0's end of a group so engines blocked in a broadcast fail now, not at their timeout."""
    from rlvr.sync.group import WeightGroup

    if isinstance(group, WeightGroup):
        group.shutdown()
        return
    for method in ("abort", "shutdown"):
        fn = getattr(group, method, None)
        if fn is not None:
            try:
                fn()
                return
            except Exception:  # noqa: BLE001, S112 - try the next way; the group is being dropped anyway
                continue


class BroadcastSync:
    """`WeightSync` over a {trainer rank 0, engine ranks} broadcast group (see the module docstring).

    Every trainer rank constructs it and calls `push`; `client` (an `SGLangClient`) is needed
    on rank 0 only. `dtype` casts on the wire (e.g. bf16 engines); `engine_factory(url)` and
    `join` are seams for tests.
    """

    def __init__(
        self,
        model: Any,
        *,
        client: Any = None,
        timeout_s: float = 600.0,
        bucket_mb: float = 256,
        on_engine_failure: str = "fail",
        dtype: Any = None,
        backend: str | None = None,
        master_address: str | None = None,
        group_name: str = "rlvr_weights",
        pause_mode: str = "abort",
        wire_format: str = "flattened_bucket",
        engine_factory: Callable[[str], Any] | None = None,
        join: Callable[..., Any] | None = None,
    ):
        import torch

        from rlvr.trainer import dist as d

        self.model = model
        self.rank = d.rank()
        self.dtype = dtype
        self.timeout_s = float(timeout_s)
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.device = "cpu" if self.backend == "gloo" else None
        self.forced_dtype = dtype
        self.bucket_mb = bucket_mb
        self.wire_dtype: str | None = None
        self._set_wire_dtype(None if dtype is None else str(dtype).removeprefix("torch."))
        self.group_name = group_name
        self.pause_mode = pause_mode
        if wire_format not in ("flattened_bucket", "per_tensor"):
            raise ValueError(f"wire_format must be 'flattened_bucket' or 'per_tensor', got {wire_format!r}")
        self.wire_format = wire_format
        self._flat_buffers: list[Any] = []
        self.engines: Engines | None = None
        if self.rank == 0:
            if client is None:
                raise ValueError("BroadcastSync needs the rollout client on trainer rank 0")
            self.engines = Engines(client, timeout_s=timeout_s, on_failure=on_engine_failure, factory=engine_factory)
        self.master_address = master_address
        self._join = join
        self._group: Any = None
        self._group_label = ""
        self._members: list[str] = []
        self._stale: tuple[list[str], str] = ([], "")  # the last group's engines and name, to destroy
        self._generation = 0
        self._instance = secrets.token_hex(4)
        self._staging: dict[Any, Any] = {}
        self._fatal: str | None = None

    def _set_wire_dtype(self, name: str | None) -> None:
        """Plan the buckets for tensors cast to `name` (None: each tensor's own dtype)."""
        import torch

        self.wire_dtype = name
        self.specs = weight_specs(self.model, dtype=None if name is None else getattr(torch, name))
        self.buckets = plan_buckets(self.specs, bucket_mb=self.bucket_mb)
        self._flat_buffers, self._staging = [], {}

    # -- the Protocol --------------------------------------------------------------------

    def push(self, *, version: int) -> dict[str, float]:
        """Collective: pause -> flush -> broadcast every bucket -> resume; returns metrics on every rank."""

        start = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            decision = agree(self._prepare(version, recover=attempts == 1) if self.rank == 0 else None)
            if decision.get("wire_dtype") != self.wire_dtype:
                self._set_wire_dtype(decision.get("wire_dtype"))
            transfer_start = time.monotonic()
            failures = self._transfer(version)
            transfer_s = time.monotonic() - transfer_start
            decision = agree(self._finish(version, failures) if self.rank == 0 else None)
            if decision["state"] == "ok":
                break
        total_bytes = sum(s.nbytes for s in self.specs)
        return {
            "sync/seconds": time.monotonic() - start,
            "sync/transfer_seconds": transfer_s,
            "sync/gb": total_bytes / 1e9,
            "sync/gb_per_s": total_bytes / 1e9 / max(transfer_s, 1e-9),
            "sync/buckets": float(len(self.buckets)),
            "sync/engines": float(decision["engines"]),
            "sync/dropped_engines": float(decision["dropped"]),
            "sync/attempts": float(attempts),
            "sync/version": float(version),
        }

    def close(self) -> None:
        self._drop_group()
        if self.engines is not None:
            self.engines.close()

    # -- rank 0: before the transfer -----------------------------------------------------

    def _prepare(self, version: int, *, recover: bool = True) -> dict[str, Any]:
        """Rank 0: (re)build the group if membership changed, then pause, flush and begin on every engine."""
        engines = self.engines
        assert engines is not None
        try:
            if recover:  # once per push: an engine dropped by this push does not rejoin it
                engines.recover()
            for _ in range(len(engines.live()) + 2):
                members = engines.live()
                if not members:
                    raise SyncError(f"weight sync to version {version}: no live rollout engine")
                failures = engines.unhealthy(members)
                if failures:
                    engines.handle(failures, version=version)
                    continue
                if self._group is None or members != self._members:
                    failures = self._rebuild(members)
                    if failures:
                        engines.handle(failures, version=version)
                        continue
                failures = engines.call(members, "pause", "pause", self.pause_mode)
                ok = [m for m in members if m not in {f.url for f in failures}]
                failures += engines.call(ok, "flush", "flush_cache")
                ok = [m for m in ok if m not in {f.url for f in failures}]
                failures += self._begin(ok)
                if failures:
                    self._end([m for m in members if m not in {f.url for f in failures}])
                    engines.handle(failures, version=version)
                    continue
                return {"state": "go", "wire_dtype": self.wire_dtype}
            raise SyncError(f"weight sync to version {version}: engines kept failing during setup")
        except SyncError as exc:
            return self._fail(exc)
        except Exception as exc:  # noqa: BLE001 - every rank must learn that rank 0 failed
            log.exception("weight sync setup failed")
            return self._fail(SyncError(f"weight sync to version {version} failed on trainer rank 0: {exc!r}"))

    def _begin(self, members: list[str]) -> list[EngineFailure]:
        """Open the weight-update session; one left open by a failed push is ended and reopened."""
        engines = self.engines
        assert engines is not None
        failures = engines.call(members, "begin_weight_update", "begin_weight_update")
        stale = [f.url for f in failures if "already open" in f.error]
        if stale:
            engines.call(stale, "end_weight_update", "end_weight_update")
            retried = engines.call(stale, "begin_weight_update", "begin_weight_update")
            failures = [f for f in failures if f.url not in stale] + retried
        return failures

    def _end(self, members: list[str]) -> list[EngineFailure]:
        engines = self.engines
        assert engines is not None
        return engines.call(members, "end_weight_update", "end_weight_update") if members else []

    def _layout(self, members: list[str]) -> tuple[dict[str, int], str | None, list[EngineFailure]]:
        """Each engine's rank count (its tp_size) and the engines' weight dtype, from /server_info.

        An engine without the route (or a fake without the method) counts as the client's
        `ranks_per_server` ranks. dp_size > 1 is refused: SGLang's distributed update routes
        assert dp_size == 1.
        """
        engines = self.engines
        assert engines is not None
        answers = engines.results(members, "server_info")
        ranks: dict[str, int] = {}
        dtypes: set[str] = set()
        failures: list[EngineFailure] = []
        for url in members:
            info = answers.get(url)
            info = info if isinstance(info, dict) else {}
            dp = int(info.get("dp_size") or 1)
            if dp > 1:
                why = f"dp_size = {dp}: SGLang's distributed weight update needs dp_size == 1 (use sync.method = disk)"
                failures.append(EngineFailure(url, "server_info", why))
                continue
            ranks[url] = int(info.get("tp_size") or engines.ranks_per_server)
            if isinstance(info.get("dtype"), str):
                dtypes.add(self._resolve_dtype(info["dtype"]))
        dtypes.discard("")
        if len(dtypes) > 1:
            raise SyncError(f"rollout engines serve different dtypes {sorted(dtypes)}; one wire dtype is needed")
        return ranks, (dtypes.pop() if dtypes else None), failures

    def _resolve_dtype(self, name: str) -> str:
        return engine_dtype(name, self.model)

    def _fail(self, exc: SyncError) -> dict[str, Any]:
        return {
            "state": "fail",
            "message": str(exc),
            "failures": [(f.url, f.stage, f.error) for f in exc.failures],
        }

    def _rebuild(self, members: list[str]) -> list[EngineFailure]:
        """Create a fresh group with `members`; returns the engines that failed to join."""
        from rlvr.sync.group import join_group

        engines = self.engines
        assert engines is not None
        self._drop_group()
        old_members, old_label = [m for m in self._stale[0] if m in members], self._stale[1]
        self._stale = ([], "")
        if old_members and old_label:  # free the engines' member of the old group (SGLang keeps it otherwise)
            for failure in engines.call(
                old_members, "destroy_weights_update_group", "destroy_weights_update_group", old_label
            ):
                log.info("weight sync: destroying group %s: %s", old_label, failure)
        ranks, dtype, failures = self._layout(members)
        if failures:
            return failures
        if self.forced_dtype is None and dtype is not None and dtype != self.wire_dtype:
            self._set_wire_dtype(dtype)
        self._generation += 1
        # Unique per sync, not only per rebuild: an engine keeps every group name it ever joined
        # (torch's registry, in SGLang and vLLM alike) and refuses one again, so a trainer that
        # restarts against engines that stayed up (a resume, another run) must not reuse a name.
        label = f"{self.group_name}-{self._instance}-{self._generation}"
        address = self.master_address or reachable_address(members)
        port = free_port(address)
        world = 1 + sum(ranks.values())
        offsets, next_rank = {}, 1
        for url in members:
            offsets[url], next_rank = next_rank, next_rank + ranks[url]
        futures = engines.submit(
            members,
            "init_weights_update_group",
            master_address=address,
            master_port=port,
            world_size=world,
            group_name=label,
            backend=self.backend,
            per_url=lambda url: {"rank_offset": offsets[url]},
        )
        holder: dict[str, Any] = {}
        join = self._join or join_group

        def host() -> None:
            try:
                holder["group"] = join(
                    master_address=address,
                    master_port=port,
                    rank=0,
                    world_size=world,
                    group_name=label,
                    backend=self.backend,
                    timeout_s=self.timeout_s,
                )
            except BaseException as exc:  # noqa: BLE001 - reported below
                holder["error"] = exc

        thread = threading.Thread(target=host, name="rlvr-sync-join", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.timeout_s
        # Wait for the join, but stop early once an engine has answered with a failure:
        # the others then wait for it in vain until the timeout.
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(timeout=0.05)
            done = {u: f for u, f in futures.items() if f.done()}
            if done and engines.collect(done, "init_weights_update_group", timeout_s=0):
                break
        if not thread.is_alive() and "group" in holder:
            failures = engines.collect(futures, "init_weights_update_group")
            if not failures:
                self._group, self._group_label, self._members = holder["group"], label, list(members)
                log.info("weight sync group %s: %d engines, world %d, %s:%d", label, len(members), world, address, port)
                return []
            _abort(holder["group"])
            return failures
        done = {u: f for u, f in futures.items() if f.done()}
        failures = engines.collect(done, "init_weights_update_group", timeout_s=0)
        if failures:
            return failures
        if "error" in holder:
            why = f"group {label} at {address}:{port} failed: {holder['error']!r}"
        else:
            why = f"did not join group {label} at {address}:{port} within {self.timeout_s:g}s"
        return [EngineFailure(url, "init_weights_update_group", why) for url in futures if not futures[url].done()] or [
            EngineFailure(url, "init_weights_update_group", why) for url in members
        ]

    def _drop_group(self) -> None:
        if self._group is not None:
            _abort(self._group)
            self._stale = (list(self._members), self._group_label)  # engines still hold their member
        self._group, self._members = None, []

    # -- every rank: the transfer --------------------------------------------------------

    def _weights(self) -> Iterator[tuple[str, Any]]:
        from rlvr.trainer.weights import iter_full_weights

        return iter_full_weights(self.model, dtype=None, device=self.device)

    def _transfer(self, version: int) -> list[EngineFailure]:
        """Gather every tensor (all ranks, lockstep); rank 0 also broadcasts. Returns rank 0's failures."""
        weights = self._weights()
        if self.rank != 0:
            for _ in weights:
                pass
            return []
        failures: list[EngineFailure] = []
        self._fatal = None
        try:
            failures = self._send(weights, version)
        except Exception as exc:  # noqa: BLE001 - every rank must learn that rank 0 failed
            log.exception("weight sync transfer failed")
            self._drop_group()
            self._fatal = f"weight sync to version {version} failed on trainer rank 0: {exc!r}"
        finally:
            for _ in weights:  # keep the other trainer ranks' all-gathers company after a failure
                pass
        return failures

    def _send(self, weights: Iterator[tuple[str, Any]], version: int) -> list[EngineFailure]:
        if self.wire_format == "flattened_bucket":
            return self._send_flat(weights, version)
        return self._send_per_tensor(weights, version)

    def _request(self, index: int, version: int, **extra: Any) -> dict[str, Any]:
        """Send bucket `index`'s `/update_weights_from_distributed` to every member; returns the futures."""
        engines = self.engines
        assert engines is not None
        bucket = self.buckets[index]
        last = index == len(self.buckets) - 1
        return engines.submit(
            list(self._members),
            "update_weights_from_distributed",
            [s.name for s in bucket],
            [s.dtype for s in bucket],
            [list(s.shape) for s in bucket],
            group_name=self._group_label,
            version=version if last else None,
            flush_cache=last,
            **extra,
        )

    def _wire(self) -> tuple[Engines, Any, list[str], Any, timedelta]:
        """What a send needs: the engines, the group, its members, root-0 broadcast options, the wait."""
        import torch.distributed as dist

        engines, group = self.engines, self._group
        assert engines is not None and group is not None
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return engines, group, list(self._members), options, timedelta(seconds=self.timeout_s)

    def _send_flat(self, weights: Iterator[tuple[str, Any]], version: int) -> list[EngineFailure]:
        """Flattened buckets, two in flight on gloo (see "Pipelining" in the module docstring).

        Per bucket i: pack it (bucket i-1 is on the wire meanwhile), wait until bucket i-1's
        broadcast is done, collect the answers up to bucket i-2 (gloo; up to i-1 on NCCL),
        then send bucket i's request and start its broadcast.
        """
        engines, group, members, options, wait = self._wire()
        ahead = 1 if self.backend == "gloo" else 0  # requests left unanswered when the next one leaves
        pending: list[tuple[int, dict[str, Any]]] = []  # requests sent, answers not collected, in bucket order
        work: Any = None  # the broadcast of pending[-1]

        def answers(keep: int) -> list[EngineFailure]:
            """Collect the oldest answers until `keep` requests remain (one deadline for all)."""
            failures: list[EngineFailure] = []
            deadline = time.monotonic() + self.timeout_s
            while len(pending) > keep:
                index, futures = pending.pop(0)
                stage = f"update_weights_from_distributed (bucket {index + 1}/{len(self.buckets)})"
                left = max(0.0, deadline - time.monotonic())
                failures = _merge(failures, engines.collect(futures, stage, timeout_s=left))
            return failures

        def fail(failures: list[EngineFailure], error: BaseException | None) -> list[EngineFailure]:
            if error is not None:
                _abort(group)  # receivers blocked on a bucket fail now, so their answers come back
            failures = _merge(failures, answers(0))
            self._drop_group()
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

        for index, bucket in enumerate(self.buckets):
            flat = self._pack(weights, bucket, slot=index % 2)  # overlaps bucket index-1 on the wire
            failures = landed(ahead)
            if failures:
                return failures
            pending.append((index, self._request(index, version, load_format="flattened_bucket")))
            try:
                work = group.broadcast([flat], options)
            except BaseException as exc:  # noqa: BLE001 - attributed like a broken broadcast
                return fail([], exc)
        return landed(0)

    def _pack(self, weights: Iterator[tuple[str, Any]], bucket: list[TensorSpec], *, slot: int) -> Any:
        """Gather the bucket's tensors; return their bytes back to back as one uint8 tensor.

        Tensors already back to back in memory (with the wire dtype) are returned as a view;
        otherwise they are copied into buffer `slot` (two alternate, so one can be packed
        while the other is on the wire).
        """
        import torch

        tensors = []
        for spec in bucket:
            name, tensor = next(weights)
            if name != spec.name:
                raise RuntimeError(f"weight order changed: expected {spec.name}, got {name}")
            target = getattr(torch, spec.dtype)
            tensors.append(tensor if tensor.dtype == target else tensor.to(target))
        view = back_to_back_bytes(tensors)
        if view is not None:
            return view
        total = sum(s.nbytes for s in bucket)
        device = tensors[0].device
        while len(self._flat_buffers) <= slot:
            largest = max(sum(s.nbytes for s in b) for b in self.buckets)
            self._flat_buffers.append(torch.empty(largest, dtype=torch.uint8, device=device))
        buffer = self._flat_buffers[slot]
        if buffer.device != device:
            buffer = self._flat_buffers[slot] = torch.empty(buffer.numel(), dtype=torch.uint8, device=device)
        offset = 0
        for tensor, spec in zip(tensors, bucket, strict=True):
            buffer[offset : offset + spec.nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
            offset += spec.nbytes
        return buffer[:total]

    def _send_per_tensor(self, weights: Iterator[tuple[str, Any]], version: int) -> list[EngineFailure]:
        engines, group, members, options, wait = self._wire()
        for index, bucket in enumerate(self.buckets):
            futures = self._request(index, version)
            error: BaseException | None = None
            works: list[tuple[Any, Any]] = []
            offsets: dict[str, int] = {}
            try:
                for spec in bucket:
                    name, tensor = next(weights)
                    if name != spec.name:
                        raise RuntimeError(f"weight order changed: expected {spec.name}, got {name}")
                    tensor = self._stage(tensor, spec, offsets)
                    works.append((group.broadcast([tensor], options), tensor))
                for work, _ in works:
                    work.wait(wait)
            except BaseException as exc:  # noqa: BLE001 - a broken collective is an engine failure to attribute
                error = exc
                _abort(group)  # receivers blocked on the rest of the bucket fail now
            failures = engines.collect(
                futures, f"update_weights_from_distributed (bucket {index + 1}/{len(self.buckets)})"
            )
            if error is not None or failures:
                self._drop_group()
                return self._culprits(members, failures, error)
        return []

    def _stage(self, tensor: Any, spec: TensorSpec, offsets: dict[str, int]) -> Any:
        """The tensor to send: itself when it already has the wire dtype and layout, else a
        slice of the preallocated flat buffer of that dtype (reused by every bucket)."""
        import torch

        target = getattr(torch, spec.dtype)
        if tensor.dtype == target and tensor.is_contiguous():
            return tensor
        numel = tensor.numel()
        start = offsets.get(spec.dtype, 0)
        offsets[spec.dtype] = start + numel
        buffer = self._staging.get(spec.dtype)
        if buffer is None or buffer.device != tensor.device:
            largest = max(sum(s.nbytes for s in b if s.dtype == spec.dtype) for b in self.buckets)
            buffer = torch.empty(largest // spec.itemsize, dtype=target, device=tensor.device)
            self._staging[spec.dtype] = buffer
        view = buffer[start : start + numel].view(spec.shape)
        view.copy_(tensor)
        return view

    def _culprits(
        self, members: list[str], failures: list[EngineFailure], error: BaseException | None
    ) -> list[EngineFailure]:
        """Which engines to blame. A broken broadcast makes healthy receivers fail too (rank 0
        tore the group down), so blame those that no longer answer /health, else those that
        never answered, else every failure."""
        engines = self.engines
        assert engines is not None
        if error is None:
            return failures
        detail = f"broadcast failed: {type(error).__name__}: {error}"
        suspects = failures or [EngineFailure(u, "update_weights_from_distributed", detail) for u in members]
        healthy = engines.healthy([f.url for f in suspects])
        dead = [
            EngineFailure(f.url, f.stage, f"{f.error} (no /health; {detail})") for f in suspects if f.url not in healthy
        ]
        silent = [f for f in suspects if "no answer within" in f.error]
        return dead or silent or suspects

    # -- rank 0: after the transfer ------------------------------------------------------

    def _finish(self, version: int, failures: list[EngineFailure]) -> dict[str, Any]:
        engines = self.engines
        assert engines is not None
        try:
            members = list(self._members) or engines.live()
            if self._fatal:
                self._end([m for m in members if m not in {f.url for f in failures}])
                raise SyncError(self._fatal)
            if failures:
                self._end([m for m in members if m not in {f.url for f in failures}])
                engines.handle(failures, version=version)  # raises in fail mode
                return {"state": "retry"}
            failures = self._end(members)
            ok = [m for m in members if m not in {f.url for f in failures}]
            failures += engines.call(ok, "resume", "resume")
            engines.handle(failures, version=version)
            engines.admit_rejoined()
            return {"state": "ok", "engines": len(engines.live()), "dropped": len(engines.dropped)}
        except SyncError as exc:
            return self._fail(exc)
