"""Serving a LoRA adapter on the embedded engine: the base weights plus the adapter, merged.

Each load replaces the previous adapter, never stacks on it, so the loader remembers which
weights the last one merged and puts back to the base what the new one does not target.
The merging itself is `rlvr.server.lora_merge`; the weights go in through `WeightReceiver`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.server.receiver import WeightReceiver

ADAPTER_BUCKET_BYTES = 256 * 2**20
"""Merged LoRA weights built before they are copied in (`AdapterLoader.load`): bounds the
transient memory of an adapter load to one bucket, not every targeted weight."""


class AdapterLoader:
    """Merges peft LoRA adapters onto the base read from `base_path` (the engine's own folder)."""

    def __init__(self, weights: WeightReceiver, *, base_path: str):
        self.weights = weights
        self.base_path = base_path
        self._merged: frozenset[str] = frozenset()  # what the last adapter merged
        self.fingerprint: dict[str, tuple[int, int, int, int]] = {}  # peft key -> checksum, of the last adapter merged

    def load(self, path: str | Path, *, version: str | None = None) -> None:
        """Serve the base weights plus a peft LoRA adapter: W_base + (lora_alpha / r) * B @ A for
        every module it targets (`rlvr.server.lora_merge`); what the previous adapter merged and
        this one does not target goes back to the base (each load replaces, never stacks). The
        folder is checked against the base before any weight changes (a bad one raises
        `AdapterError` and sets no version). The merged tensors go in through `load_state_dict`,
        in buckets of `ADAPTER_BUCKET_BYTES`, under one hold of the step lock, so no step sees
        half of them; the version comes last.
        """
        from rlvr.server.lora_merge import AdapterMerge

        weights = self.weights
        merge = AdapterMerge(path, self.base_path, previous=self._merged)
        table = weights.weight_table()
        for name, shape in merge.shapes().items():  # the base folder must be this model's
            if name not in table or tuple(table[name].shape) != shape:
                raise ValueError(f"{self.base_path}: {name} {list(shape)} does not match the served model")
        dtype = weights.model.dtype
        with weights.scheduler.step_lock:
            try:
                bucket: list[tuple[str, Any]] = []
                size = 0
                for name, tensor in merge.tensors(dtype=dtype, device=weights.device):
                    bucket.append((name, tensor))
                    size += tensor.numel() * tensor.element_size()
                    if size >= ADAPTER_BUCKET_BYTES:
                        weights.load_state_dict(bucket, version=None)
                        bucket, size = [], 0
                weights.load_state_dict(bucket, version=version)
            except BaseException:
                # Part may be in: the next adapter load puts these back to the base as well.
                self._merged = self._merged | merge.merged
                raise
            self._merged = merge.merged
            self.fingerprint = merge.fingerprint
