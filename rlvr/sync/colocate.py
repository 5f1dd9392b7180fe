"""rollout.colocate: trainer ranks and rollout engines take turns on the same GPUs.

Each step of the synchronous loop (k = 0: nothing generates while the trainer trains):

    take(s)        engines generate wave s (awake, holding weights and KV cache)
    release()      engines free their GPU memory; every rank waits for it before training
    train step     the trainer has the GPUs
    resume()       every rank empties its CUDA cache, then the engines take their memory back
    push(s + 1)    the new weights reach the awake engines (the usual WeightSync)

Only rank 0 talks to the engines; the barriers keep either side from allocating before the other
let go. A failure raises SyncError, and the loop stops as after a failed push (docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlvr.sync.base import Decision, agree
from rlvr.sync.engine_calls import EngineCalls, EngineFactory

if TYPE_CHECKING:
    from rlvr.recipe.schema import Recipe


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _barrier() -> None:
    from rlvr.trainer import dist as d

    d.barrier()


class Colocation:
    """The release/resume calls around a colocated trainer's step. `client`: the loop's rollout
    client on rank 0, None elsewhere. `factory`, `free_cache`, `barrier`: tests' fakes."""

    def __init__(
        self,
        client: object,
        *,
        timeout_s: float,
        factory: EngineFactory | None = None,
        free_cache: Callable[[], None] = _empty_cuda_cache,
        barrier: Callable[[], None] = _barrier,
    ):
        self.calls = EngineCalls(client, timeout_s=timeout_s, factory=factory) if client is not None else None
        self.free_cache = free_cache
        self.barrier = barrier
        self.asleep = False

    def release(self) -> None:
        """Before the trainer's step: the engines give their memory back. Raises SyncError on
        every rank when one could not (rank 0's outcome is broadcast)."""
        self._call("release_memory_occupation", "release memory")
        self.asleep = True
        self.barrier()

    def resume(self) -> None:
        """Before the push: the trainer lets go of its cached blocks, then the engines wake."""
        if not self.asleep:
            return
        self.free_cache()
        self.barrier()
        self._call("resume_memory_occupation", "resume memory")
        self.asleep = False

    def _call(self, method: str, stage: str) -> None:
        decision = None
        if self.calls is not None:
            failures = self.calls.call(self.calls.live(), stage, method)
            detail = "; ".join(str(f) for f in failures)
            message = f"colocated engines could not {stage}: {detail}"
            decision = Decision("fail", message, tuple(failures)) if failures else Decision("ok")
        agree(decision)

    def close(self) -> None:
        if self.calls is not None:
            self.calls.close()


def colocation_for(recipe: Recipe, *, client: object) -> Colocation | None:
    """The recipe's Colocation (every trainer rank builds one: the barriers are collective), or
    None when the engines have GPUs of their own."""
    if not recipe.rollout.colocate:
        return None
    return Colocation(client, timeout_s=recipe.sync.timeout_s)
