"""Weight sync of a LoRA policy's adapters only (`sync.lora = "adapter"`).

Why: the adapters are a few MB where the merged model is GBs, so a push costs a small file instead
of a full broadcast or export, and the engines never need the trainer's dtype or layout. Each push
writes the adapters in peft's format to `shared_dir/adapters/v{version}` (`rlvr.trainer.lora.
write_adapter`, atomic), and every engine merges them into the base weights it was started on
(`load_lora_adapter`: `rlvr serve` and vLLM; W = W_base + alpha/r * B @ A, replacing the previous
adapter). Pause, flush, version and failure handling are `DiskSync`'s: the same contract as a
full push, so partial rollouts and `max_staleness` see no difference.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.sync.disk import DiskSync


class AdapterSync(DiskSync):
    """`WeightSync` of a LoRA model's adapters through `shared_dir` (every rollout node must see it)."""

    folder = "adapters"
    load_method = "load_lora_adapter"
    verifiable = False  # the engine serves base + adapter merged, not the adapter file: not verified yet

    def _write(self, path: Path) -> None:
        from rlvr.trainer.lora import write_adapter

        write_adapter(self.model, path)
