"""A long reply (a group's token ids and logprobs) is parsed off the event loop; a short one on it."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web

from rlvr.rollout import pool as http_pool
from tests.conftest import serve_app


async def serve(body: str) -> tuple[web.AppRunner, str]:
    app = web.Application()

    async def answer(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    app.router.add_post("/generate", answer)
    return await serve_app(app)


def test_long_replies_are_decoded_on_a_worker_thread(monkeypatch) -> None:
    threads: list[str] = []
    real = http_pool.jsonlib.loads

    def loads(text: str) -> Any:
        threads.append(threading.current_thread().name)
        return real(text)

    monkeypatch.setattr(http_pool.jsonlib, "loads", loads)
    long_reply = {"output_ids": list(range(40_000)), "meta_info": {"finish_reason": "length"}}

    async def main() -> list[Any]:
        out = []
        for body in (json.dumps({"ok": 1}), json.dumps(long_reply)):
            runner, url = await serve(body)
            pool = http_pool.ServerPool([url])
            try:
                out.append(await pool.request(pool.servers[0], "POST", "/generate", json={}, generation=True))
            finally:
                await pool.close()
                await runner.cleanup()
        return out

    loop_thread = threading.current_thread().name
    short, long = asyncio.run(main())
    assert short == {"ok": 1} and long == long_reply
    assert len(json.dumps(long_reply)) > http_pool.OFF_LOOP_JSON_CHARS
    assert threads[0] == loop_thread and threads[1] != loop_thread, threads
