"""Generation fencing, the rule every engine rlvr starts applies: `rlvr serve` and vLLM alike.

A trainer's client sends its generation (`X-Rlvr-Generation`, one per trainer start) with every
call. Once an engine has seen a generation, the calls that change what it serves (weights, the
update group, pause and continue, sleep: every POST but generation) from an older one are refused
with a 409 whose body says `stale_generation`, which that stale trainer prints before it stops
(`rlvr.rollout.pool`). Calls without the header (rlvr eval, a judge's client) are not fenced. A
server the launcher started also reads the run's generation record (RLVR_GENERATION_FILE) before it
decides: restarted after a trainer restart, it has seen no call yet, and must not take the first
caller's word for which trainer is newest. It runs inside vLLM's API server too, so it imports
nothing but the standard library and rlvr.rundir.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlvr.rundir import GENERATION_FILE_ENV, GENERATION_HEADER, STALE_STATUS, read_json

UNFENCED = ("/generate", "/v1/", "/inference/v1/")  # POSTs any trainer may make: generation, a judge's OpenAI calls


class GenerationFence:
    """The newest generation one server has seen, and what it refuses of older ones."""

    def __init__(self, *, record: Path | None = None) -> None:
        """`record`: the run's generation file (default RLVR_GENERATION_FILE; none: calls alone decide)."""
        self.newest = 0
        path = record or os.environ.get(GENERATION_FILE_ENV)
        self.record = Path(path) if path else None

    def check(self, raw: str | None, *, method: str, path: str) -> tuple[int, dict[str, Any]] | None:
        """None when the call goes through; else the (status, JSON body) to answer with."""
        if raw is None:  # not a fenced trainer: as before
            return None
        if not raw.strip().isdigit():
            return 400, {"error": f"{GENERATION_HEADER} must be a whole number, got {raw!r}"}
        generation = int(raw)
        fenced = method == "POST" and not path.startswith(UNFENCED)
        if fenced and self.record is not None:
            data = read_json(self.record)
            self.newest = max(self.newest, int(data.get("generation", 0)) if isinstance(data, dict) else 0)
        if generation > self.newest:
            self.newest = generation
        elif generation < self.newest and fenced:
            message = (
                f"{path.lstrip('/')} refused: trainer generation {generation} is stale, this server has seen "
                f"generation {self.newest} (a newer trainer was started); the stale trainer stops"
            )
            return STALE_STATUS, {"success": False, "message": message, "stale_generation": True}
        return None
