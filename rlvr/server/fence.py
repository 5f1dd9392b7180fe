"""Generation fencing, the rule every engine rlvr starts applies: `rlvr serve` and vLLM alike.

A trainer's client sends its generation (`X-Rlvr-Generation`, one per trainer start) with every
call. Once an engine has seen a generation, the calls that change what it serves (weights, the
update group, pause and continue, sleep: every POST but generation) from an older one are refused
with a 409 whose body says `stale_generation`, which that stale trainer prints before it stops
(`rlvr.rollout.pool`). Calls without the header (rlvr eval, a judge's client) are not fenced. It
runs inside vLLM's API server too, so it imports nothing but the standard library and rlvr.rundir.
"""

from __future__ import annotations

from typing import Any

from rlvr.rundir import GENERATION_HEADER, STALE_STATUS

UNFENCED = ("/generate", "/v1/", "/inference/v1/")  # POSTs any trainer may make: generation, a judge's OpenAI calls


class GenerationFence:
    """The newest generation one server has seen, and what it refuses of older ones."""

    def __init__(self) -> None:
        self.newest = 0

    def check(self, raw: str | None, *, method: str, path: str) -> tuple[int, dict[str, Any]] | None:
        """None when the call goes through; else the (status, JSON body) to answer with."""
        if raw is None:  # not a fenced trainer: as before
            return None
        if not raw.strip().isdigit():
            return 400, {"error": f"{GENERATION_HEADER} must be a whole number, got {raw!r}"}
        generation = int(raw)
        if generation > self.newest:
            self.newest = generation
        elif generation < self.newest and method == "POST" and not path.startswith(UNFENCED):
            message = (
                f"{path.lstrip('/')} refused: trainer generation {generation} is stale, this server has seen "
                f"generation {self.newest} (a newer trainer was started); the stale trainer stops"
            )
            return STALE_STATUS, {"success": False, "message": message, "stale_generation": True}
        return None
