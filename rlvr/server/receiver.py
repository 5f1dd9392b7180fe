"""How new weights reach the embedded engine's live model: named tensors, a safetensors folder, or
buckets broadcast over a weight-update group (`rlvr.sync.group`), as SGLang's update calls.

Every load writes the model's own storage in place (the fast path's fused tensors are that
storage) under the scheduler's step lock, so no step sees half of it; the decoder's derived
tensors are then refreshed and the version set. A bad name or shape is refused before any weight
changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.server.batching import Scheduler
from rlvr.weight_arena import back_to_back_bytes


class WeightReceiver:
    """Loads weights into `model` between the `scheduler`'s steps; owns the update groups and
    sessions. `arena`: the one buffer the weights live in, in the trainer's send order (or None)."""

    def __init__(self, model: Any, scheduler: Scheduler, *, device: str, arena: Any):
        self.model = model
        self.scheduler = scheduler
        self.device = device
        self.arena = arena
        self.groups: dict[str, Any] = {}  # group name -> its process group
        self.update_session = False  # SGLang 0.5.23: distributed updates only inside begin/end
        self._session_table: dict[str, Any] | None = None  # the weight table, built once per session
        self._derived_stale = False  # a session's bucket landed without the refresh of derived tensors
        self._staging: dict[tuple[Any, ...], list[Any]] = {}  # (dtype, shape, device) -> receive buffers

    def _set_version(self, version: str | None) -> None:
        if version is not None:
            self.scheduler.weight_version = str(version)

    def _refresh(self) -> None:
        """Rebuild the decoder's derived tensors (packed copies start at once unless paused)."""
        self.scheduler.backend.refresh(start=not self.scheduler.paused)

    # -- named tensors and folders --------------------------------------------------------------

    def load_state_dict(self, tensors: dict[str, Any] | list[tuple[str, Any]], *, version: str | None) -> None:
        """Copy named HF tensors into the model in place (the fast path reads the same storage)."""
        import torch

        items = tensors.items() if isinstance(tensors, dict) else tensors
        params = self.weight_table()
        with self.scheduler.step_lock, torch.no_grad():
            unknown = [name for name, _ in items if name not in params]
            if unknown:
                raise KeyError(f"unknown parameter names: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
            for name, tensor in items:
                target = params[name]
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} != model's {tuple(target.shape)}")
            self.scheduler.backend.invalidate()
            for name, tensor in items:
                target = params[name]
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            self._refresh()
            self._set_version(version)

    def load_from_disk(self, path: str | Path, *, version: str | None = None) -> None:
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
        params = self.weight_table()
        headers = [safetensors_header(file)[0] for file in files]
        unknown = [name for header in headers for name in header if name not in params]
        if unknown:
            raise KeyError(f"unknown parameter names: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
        for header in headers:
            for name, info in header.items():
                if tuple(info["shape"]) != tuple(params[name].shape):
                    raise ValueError(f"{name}: shape {tuple(info['shape'])} != model's {tuple(params[name].shape)}")
        with self.scheduler.step_lock, torch.no_grad():
            self.scheduler.backend.invalidate()
            read_safetensors_into(files, {name: param.detach() for name, param in params.items()})
            self._refresh()
            self._set_version(version)

    def fingerprint(self) -> dict[str, tuple[int, int, int, int]]:
        """Every served weight's exact checksum under its HF names (`rlvr.sync.fingerprint`), read from
        the live parameters after the load (not from what arrived).

        A tied alias is the tensor the model uses under that name (`lm_head.weight` is the output
        embedding's weight), so a head that stopped following its embedding shows up as itself."""
        import torch

        from rlvr.sync.fingerprint import fingerprint

        with self.scheduler.step_lock, torch.no_grad():
            return fingerprint(self.weight_table().items())

    def weight_table(self) -> dict[str, Any]:
        """Every HF state_dict name (tied aliases included) -> its live parameter or buffer.

        Kept for a weight-update session (walking the modules once per bucket costs more than the
        bucket's bookkeeping); the model's parameters do not change identity inside one."""
        if self._session_table is not None and self.update_session:
            return self._session_table
        table: dict[str, Any] = dict(self.model.named_parameters(remove_duplicate=False))
        table.update(self.model.named_buffers(remove_duplicate=False))
        self._session_table = table if self.update_session else None
        return table

    # -- weight-update groups and sessions ------------------------------------------------------

    def join_group(
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

        if group_name in self.groups:
            raise ValueError(f"weight update group {group_name!r} already exists; destroy it first")
        self.groups[group_name] = join_group_like_sglang(
            master_address=master_address,
            master_port=master_port,
            rank=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
            timeout_s=timeout_s,
        )

    def leave_group(self, group_name: str = "weight_update_group") -> None:
        """Leave a group (as SGLang: an unknown name is an error)."""
        group = self.groups.pop(group_name, None)
        if group is None:
            raise KeyError("The group to be destroyed does not exist.")
        group.shutdown()

    def begin_session(self) -> None:
        """Open a weight-update session (SGLang 0.5.23 refuses a second one)."""
        if self.update_session:
            raise RuntimeError("a weight-update session is already open; call end_weight_update() first")
        self._session_table = None
        self.update_session = True

    def end_session(self) -> None:
        if not self.update_session:
            raise RuntimeError("no weight-update session is open; call begin_weight_update() first")
        self.update_session = False
        self._session_table = None
        if self._derived_stale:  # no bucket of this session said it was the last
            with self.scheduler.step_lock:
                self._refresh()
            self._derived_stale = False

    def receive_bucket(
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
        its weights in one buffer in the trainer's send order (`arena`), so a bucket whose
        tensors lie back to back there is received into that byte range as is; any other
        bucket lands in a staging buffer and is copied in tensor by tensor.

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
        group = self.groups.get(group_name)
        if group is None:
            raise KeyError(f"no weight update group {group_name!r}; call init_weights_update_group first")
        if not (len(names) == len(dtypes) == len(shapes)):
            raise ValueError(f"names/dtypes/shapes lengths differ: {len(names)}, {len(dtypes)}, {len(shapes)}")
        if load_format not in (None, "flattened_bucket"):
            raise ValueError(f"load_format {load_format!r} is not supported (None or 'flattened_bucket')")
        with self.scheduler.step_lock, torch.no_grad():  # no step runs while half the weights are new
            if load_format == "flattened_bucket":
                target, copies, problems = self._flat_receive_target(names, dtypes, shapes)
                targets = [target]
            else:
                targets, copies, problems = self._receive_targets(names, dtypes, shapes)
            if not problems:
                self.scheduler.backend.invalidate()
            receive_into(group, targets)
            if problems:
                raise ValueError(f"weight update refused ({len(problems)} bad tensors): {'; '.join(problems[:5])}")
            for param, staged in copies:
                param.copy_(staged)
            # Derived tensors once per sync, at its last bucket (or at end_session), not per
            # bucket: the rebuild would otherwise run between every two buckets of a push.
            self._derived_stale = not (flush_cache or version is not None)
            if not self._derived_stale:
                self._refresh()
            self._set_version(version)

    def _check_bucket(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> tuple[dict[str, Any], list[tuple[Any, tuple[int, ...]]], list[str]]:
        """The weight table, each tensor's (torch dtype, shape), and what is wrong with the bucket."""
        from rlvr.sync.group import torch_dtype

        table = self.weight_table()
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
