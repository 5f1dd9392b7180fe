"""Generation fencing inside a vLLM server (`--middleware rlvr.server.vllm_fence.generation_fence`).

vLLM's API server takes ASGI middleware by import path; this one applies the rule `rlvr serve`
applies (`rlvr.server.fence`), so a stale trainer's push to vLLM is refused with the same 409 and
line. It runs in vLLM's own Python, where Starlette is vLLM's.
"""

# pyright: reportMissingImports=false
from __future__ import annotations

from typing import Any

from rlvr.rundir import GENERATION_HEADER
from rlvr.server.fence import GenerationFence

_FENCE = GenerationFence()  # one per API server process: the one that receives every push


async def generation_fence(request: Any, call_next: Any) -> Any:
    """Starlette's http middleware: refuse a stale trainer's call, pass the rest on."""
    verdict = _FENCE.check(request.headers.get(GENERATION_HEADER), method=request.method, path=request.url.path)
    if verdict is None:
        return await call_next(request)
    from starlette.responses import JSONResponse

    status, body = verdict
    return JSONResponse(body, status_code=status)
