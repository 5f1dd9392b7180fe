"""Weight sync through a shared filesystem: export a HF folder, engines load it.

For when trainer and rollout nodes cannot join one NCCL/gloo group (different clusters,
firewalls, an engine without the distributed update API). Slower than broadcast (a full
write and read per step) but needs nothing but a directory every node sees.

Order: every trainer rank exports (collective: full tensors are gathered) to
`shared_dir/weights/v{version}` — written as `v{version}.tmp` and renamed, so an engine
never reads a half-written folder — then rank 0 pauses and flushes every engine, calls
`/update_weights_from_disk` with `weight_version`, and resumes. Generation keeps running
during the export; only the load is paused. The last `keep` folders stay (the newest may
still be loading on a slow engine when the next one lands), older ones are removed.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.sync.base import SyncError, agree
from rlvr.sync.engines import Engines

log = logging.getLogger(__name__)


class DiskSync:
    """`WeightSync` through `shared_dir` (see the module docstring); `client` needed on rank 0 only."""

    def __init__(
        self,
        model: Any,
        *,
        shared_dir: str | Path,
        client: Any = None,
        timeout_s: float = 600.0,
        on_engine_failure: str = "fail",
        dtype: Any = None,
        tokenizer: Any = None,
        keep: int = 2,
        pause_mode: str = "abort",
        engine_factory: Callable[[str], Any] | None = None,
    ):
        from rlvr.trainer import dist as d

        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.model = model
        self.rank = d.rank()
        self.root = Path(shared_dir) / "weights"
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.keep = keep
        self.pause_mode = pause_mode
        self.engines: Engines | None = None
        if self.rank == 0:
            if client is None:
                raise ValueError("DiskSync needs the rollout client on trainer rank 0")
            self.engines = Engines(client, timeout_s=timeout_s, on_failure=on_engine_failure, factory=engine_factory)

    def push(self, *, version: int) -> dict[str, float]:
        from rlvr.trainer.checkpoint import export_hf

        start = time.monotonic()
        path = self.root / f"v{version}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
        export_hf(self.model, self.tokenizer, path, dtype=self.dtype)
        export_s = time.monotonic() - start
        decision = agree(self._load(path, version) if self.rank == 0 else None)
        if self.rank == 0:
            self._prune()
        size = sum(f.stat().st_size for f in path.glob("*.safetensors")) if self.rank == 0 else 0
        return {
            "sync/seconds": time.monotonic() - start,
            "sync/export_seconds": export_s,
            "sync/load_seconds": float(decision["load_s"]),
            "sync/gb": size / 1e9,
            "sync/engines": float(decision["engines"]),
            "sync/dropped_engines": float(decision["dropped"]),
            "sync/version": float(version),
        }

    def _load(self, path: Path, version: int) -> dict[str, Any]:
        engines = self.engines
        assert engines is not None
        start = time.monotonic()
        try:
            engines.recover()
            if not engines.live():
                raise SyncError(f"weight sync to version {version}: no live rollout engine")
            updated: list[str] = []
            # An engine that answers again while this push waits for one (continue mode) joins
            # it: another round for the engines this push has not updated yet.
            for _ in range(len(engines.live()) + 2):
                members = [m for m in engines.live() if m not in updated]
                if not members:
                    break
                engines.handle(engines.unhealthy(members), version=version)  # raises in fail mode
                members = [m for m in members if m not in engines.dropped]
                for stage, method, args, kwargs in (
                    ("pause", "pause", (self.pause_mode,), {}),
                    ("flush", "flush_cache", (), {}),
                    ("update_weights_from_disk", "update_weights_from_disk", (str(path),), {"version": version}),
                    ("resume", "resume", (), {}),
                ):
                    failures = engines.call(members, stage, method, *args, **kwargs)
                    engines.handle(failures, version=version)  # raises in fail mode or when none is left
                    members = [m for m in members if m not in engines.dropped]
                updated += members
            engines.admit_rejoined(updated)
            return {
                "state": "ok",
                "engines": len(updated),
                "dropped": len(engines.dropped),
                "load_s": time.monotonic() - start,
            }
        except SyncError as exc:
            failures = [(f.url, f.stage, f.error) for f in exc.failures]
            return {"state": "fail", "message": str(exc), "failures": failures}
        except Exception as exc:  # noqa: BLE001 - every rank must learn that rank 0 failed
            log.exception("disk weight sync failed")
            message = f"weight sync to version {version} failed on trainer rank 0: {exc!r}"
            return {"state": "fail", "message": message, "failures": []}

    def _prune(self) -> None:
        versions = []
        for child in self.root.iterdir():
            if child.is_dir() and child.name.startswith("v") and child.name[1:].isdigit():
                versions.append((int(child.name[1:]), child))
        for _, child in sorted(versions)[: -self.keep]:
            shutil.rmtree(child, ignore_errors=True)

    def close(self) -> None:
        if self.engines is not None:
            self.engines.close()
