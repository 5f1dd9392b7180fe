"""rollout.colocate's order of calls in the RL loop, with a fake engine: the engines sleep before
the trainer trains, and wake before the push, which comes before the next generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import rlvr.loop as loop_module
from rlvr.loop import RLLoop
from rlvr.recipe.load import load_recipe
from rlvr.sync.base import SyncError
from rlvr.sync.colocate import Colocation
from rlvr.types import RolloutBatch

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "quickstart.toml"


class FakeEngine:
    """One engine's client (what `client.single(url)` returns): records the colocation calls."""

    def __init__(self, log: list[str], *, fail: str | None = None):
        self.log, self.fail = log, fail

    async def release_memory_occupation(self) -> None:
        if self.fail == "release":
            raise RuntimeError("no memory saver")
        self.log.append("sleep")

    async def resume_memory_occupation(self) -> None:
        self.log.append("wake")

    async def health(self) -> bool:
        return True


class FakeClient:
    """The loop's rollout client, as the manager holds it."""

    live_servers = ["http://127.0.0.1:1"]

    def __init__(self, log: list[str], **kw: Any):
        self.log, self.kw = log, kw

    def single(self, url: str, *, timeout_s: float) -> FakeEngine:
        return FakeEngine(self.log, **self.kw)


class FakeManager:
    def __init__(self, log: list[str], **kw: Any):
        self.log = log
        self.client = FakeClient(log, **kw)
        self.stop_reason = None

    def start(self, *, version: int) -> None:
        pass

    def take(self, step: int, **_: object) -> tuple[RolloutBatch, dict[str, float]]:
        self.log.append(f"generate {step}")
        return RolloutBatch(rewards=[1.0]), {}

    def pause(self) -> None:
        pass

    def resume(self, *, version: int) -> None:
        pass

    def pop_samples(self) -> list:
        return []

    def pop_events(self) -> list:
        return []


class FakeActor:
    def __init__(self, log: list[str]):
        self.log = log

    def train_step(self, batch: Any) -> dict[str, float]:
        self.log.append("train")
        return {}


class FakeSync:
    def __init__(self, log: list[str]):
        self.log = log

    def push(self, *, version: int) -> dict[str, float]:
        self.log.append(f"push {version}")
        return {}


def make_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, colocate: bool = True, **kw: Any):
    log: list[str] = []
    recipe = load_recipe(RECIPE, [f"rollout.colocate={str(colocate).lower()}", "experiment.max_steps=2"])
    monkeypatch.setattr(loop_module, "train_on", lambda rollout, *, actor, **_: actor.train_step(rollout))
    monkeypatch.setattr(RolloutBatch, "num_tokens", property(lambda self: 1), raising=False)
    loop = RLLoop(recipe, run_dir=tmp_path, actor=FakeActor(log), manager=FakeManager(log, **kw), sync=FakeSync(log))  # type: ignore[arg-type]
    monkeypatch.setattr(loop, "save", lambda: tmp_path)
    return loop, log


def test_colocated_engines_sleep_before_training_and_wake_before_the_push_that_precedes_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, log = make_loop(tmp_path, monkeypatch)
    assert loop.run() == 0
    step = ["sleep", "train", "wake"]
    assert log == ["generate 0", *step, "push 1", "generate 1", *step, "push 2"]


def test_split_engines_are_never_put_to_sleep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, log = make_loop(tmp_path, monkeypatch, colocate=False)
    assert loop.run() == 0
    assert log == ["generate 0", "train", "push 1", "generate 1", "train", "push 2"]


def test_an_engine_that_cannot_sleep_stops_the_run_before_the_trainer_takes_its_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, log = make_loop(tmp_path, monkeypatch, fail="release")
    assert loop.run() == loop_module.FAILED_EXIT
    assert "train" not in log
    assert loop.failure is not None and "release memory" in loop.failure and "no memory saver" in loop.failure


def test_the_trainer_frees_its_cached_blocks_before_the_engines_wake() -> None:
    log: list[str] = []
    colocation = Colocation(
        FakeClient(log),
        timeout_s=5,
        free_cache=lambda: log.append("empty_cache"),
        barrier=lambda: log.append("barrier"),
    )
    try:
        colocation.resume()  # awake already: nothing to do
        assert log == []
        colocation.release()
        colocation.resume()
        assert log == ["sleep", "barrier", "empty_cache", "barrier", "wake"]
    finally:
        colocation.close()


def test_a_failed_release_raises_sync_error_naming_the_engine() -> None:
    colocation = Colocation(FakeClient([], fail="release"), timeout_s=5, barrier=lambda: None)
    try:
        with pytest.raises(SyncError, match=r"http://127.0.0.1:1 \(release memory\)"):
            colocation.release()
    finally:
        colocation.close()


def test_rlvr_serve_frees_its_kv_cache_on_release_and_generates_the_same_after_resume(tiny_model_dir: Path) -> None:
    """The embedded engine behind SGLang's colocation routes: release drops the decoder (its KV
    cache) and holds generation; resume allocates it again and greedy output is unchanged."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from rlvr.server.embedded import EmbeddedEngine
    from rlvr.server.routes import create_app

    engine = EmbeddedEngine(tiny_model_dir, max_batch=4, max_seq_len=64)
    body = {"input_ids": [5, 17, 40], "sampling_params": {"temperature": 0, "max_new_tokens": 6}}

    async def scenario() -> tuple[list[int], list[int], bool]:
        async with TestClient(TestServer(create_app(engine))) as client:
            before = (await (await client.post("/generate", json=body)).json())["output_ids"]
            released = await client.post("/release_memory_occupation", json={})
            assert released.status == 200 and (await released.json())["success"]
            freed = engine.backend is None and engine.paused
            resumed = await client.post("/resume_memory_occupation", json={})
            assert resumed.status == 200
            after = (await (await client.post("/generate", json=body)).json())["output_ids"]
            return before, after, freed

    try:
        before, after, freed = asyncio.run(scenario())
    finally:
        engine.close()
    assert freed
    assert after == before and len(before) == 6


@pytest.mark.parametrize(
    ("engine", "expected"),
    [("vllm", ["/sleep?level=1&mode=abort", "/wake_up"]),
     ("sglang", ["/release_memory_occupation", "/resume_memory_occupation"])],
)  # fmt: skip
def test_each_client_speaks_its_servers_memory_routes(engine: str, expected: list[str]) -> None:
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from rlvr.rollout.sglang import SGLangClient
    from rlvr.rollout.vllm import VLLMClient

    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.json_response({})

    async def scenario() -> None:
        app = web.Application()
        for path in ("/sleep", "/wake_up", "/release_memory_occupation", "/resume_memory_occupation"):
            app.router.add_post(path, record)
        async with TestServer(app) as server:
            kind = VLLMClient if engine == "vllm" else SGLangClient
            client = kind([str(server.make_url(""))], timeout_s=5)
            try:
                await client.release_memory_occupation()
                await client.resume_memory_occupation()
            finally:
                await client.close()

    asyncio.run(scenario())
    assert seen == expected
