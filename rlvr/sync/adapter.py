"""Weight sync of a LoRA policy's adapters only (`sync.lora = "adapter"`).

Why: the adapters are a few MB where the merged model is GBs, so a push costs a small file instead
of a full broadcast or export, and the engines never need the trainer's dtype or layout. Each push
writes the adapters in peft's format to `shared_dir/adapters/v{version}` (`rlvr.trainer.lora.
write_adapter`, atomic), and every engine merges them into the base weights it was started on
(`load_lora_adapter`: `rlvr serve` and vLLM; W = W_base + alpha/r * B @ A, replacing the previous
adapter). Pause, flush, version and failure handling are `DiskSync`'s: the same contract as a
full push, so partial rollouts and `max_staleness` see no difference. Verified (`sync.verify`) by the
adapter tensors each engine merged: names and fingerprints, against the file written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.sync.disk import DiskSync
from rlvr.sync.verify import ADAPTER_PREFIX

if TYPE_CHECKING:
    from torch import Tensor


class AdapterSync(DiskSync):
    """`WeightSync` of a LoRA model's adapters through `shared_dir` (every rollout node must see it)."""

    folder = "adapters"
    load_method = "load_lora_adapter"
    verified_as_adapter = True

    def _write(self, path: Path) -> None:
        from rlvr.trainer.lora import write_adapter

        self.verifier.start()
        write_adapter(self.model, path)
        if self.rank == 0 and self.verifier.enabled:
            import safetensors.torch

            from rlvr.trainer.lora import ADAPTER_WEIGHTS

            reader: Any = safetensors.torch  # its stubs leave a path type unknown
            written: dict[str, Tensor] = reader.load_file(str(path / ADAPTER_WEIGHTS))  # what the engines read
            for key, tensor in written.items():
                self.verifier.add(ADAPTER_PREFIX + key, tensor)
