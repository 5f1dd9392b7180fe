"""Fencing: every trainer start is a generation (`RunDir.next_generation`), and once a newer one was
started, an older trainer's checkpoints, metrics and weight pushes are refused with one line (a
StaleGeneration, which no failure handler swallows), while the newest one's go through."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from aiohttp import web

from rlvr.process import free_port
from rlvr.rollout.factory import ServeClient
from rlvr.rundir import GENERATION_HEADER, RunDir, StaleGeneration, trainer_generation
from rlvr.server.routes import create_app
from rlvr.sync.engine_calls import EngineCalls
from rlvr.trainer.checkpoint import save_checkpoint


def test_each_trainer_start_is_the_next_generation_and_an_older_one_is_refused_in_one_line(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.generation() == 0
    assert [run.next_generation(), run.next_generation()] == [1, 2]
    assert RunDir(tmp_path).generation() == 2  # on disk: the next launch, or another node, counts on
    run.check_generation(2, doing="checkpoint step_4")  # the newest writes
    run.check_generation(None, doing="checkpoint step_4")  # a trainer started without one is not fenced
    with pytest.raises(StaleGeneration) as refused:
        run.check_generation(1, doing="checkpoint step_4")
    line = str(refused.value)
    assert "\n" not in line
    assert line == (
        f"trainer generation 1 is stale: generation 2 owns {tmp_path} now (a newer trainer was started); "
        "checkpoint step_4 refused, this trainer stops"
    )
    assert not isinstance(refused.value, Exception)  # past every `except Exception` of the sync and the loop
    assert trainer_generation({"RLVR_TRAINER_GENERATION": "3"}) == 3 and trainer_generation({}) is None


def test_a_stale_trainers_checkpoint_is_refused_before_it_writes_anything(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    part = SimpleNamespace(model=torch.nn.Linear(2, 2), optimizer=None, scheduler=None)
    run.next_generation()
    save_checkpoint(run.checkpoints, 1, {"actor": part}, generation=1)
    run.next_generation()
    with pytest.raises(StaleGeneration, match="checkpoint step_2 refused"):
        save_checkpoint(run.checkpoints, 2, {"actor": part}, generation=1)
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["latest", "step_1"]  # no step_2.tmp either
    assert save_checkpoint(run.checkpoints, 2, {"actor": part}, generation=2).name == "step_2"


def test_a_stale_loop_logs_and_saves_nothing_and_the_newest_does(tmp_path: Path, tiny_model_dir: Path) -> None:
    from tests.unit.loop.test_loop import make_loop

    run = RunDir(tmp_path)
    loop = make_loop(tmp_path, tiny_model_dir, steps=1)
    try:
        loop.generation = run.next_generation()
        run.next_generation()  # the launcher started another trainer
        with pytest.raises(StaleGeneration, match="the metrics of step 0 refused"):
            loop.log({"loss": 1.0})
        with pytest.raises(StaleGeneration, match="checkpoint step_0 refused"):
            loop.save()
        assert run.metrics.read_text() == "" and not run.checkpoints.exists()
        assert json.loads(run.status.read_text())["state"] == "starting"
        loop.generation = 2
        loop.log({"loss": 1.0})
        assert loop.save().name == "step_0"
        assert [json.loads(x)["step"] for x in run.metrics.read_text().splitlines()] == [0]
    finally:
        assert loop.manager is not None and loop.recorder is not None
        loop.manager.close()
        loop.recorder.close("finished")


class PausingEngine:
    """What /pause_generation and /continue_generation call."""

    model_path = "fake"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def pause(self, mode: str) -> int:
        self.calls.append(f"pause {mode}")
        return 0

    async def resume(self) -> None:
        self.calls.append("resume")


@pytest.fixture
def server() -> Iterator[tuple[str, PausingEngine]]:
    """`rlvr serve`'s routes over a fake engine, on a thread of their own."""
    engine, port, ready = PausingEngine(), free_port(), threading.Event()
    loop = asyncio.new_event_loop()

    async def start() -> web.AppRunner:
        runner = web.AppRunner(create_app(engine))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    def serve() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    yield f"http://127.0.0.1:{port}", engine
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def call(url: str, generation: int | None, method: str = "pause", *args: Any, **kwargs: Any) -> None:
    async def go() -> None:
        async with ServeClient([url], generation=generation, max_retries=0) as client:
            await getattr(client, method)(*args, **kwargs)

    asyncio.run(go())


def test_rlvr_serve_refuses_an_older_trainers_push_with_one_line_and_takes_the_newest(
    server: tuple[str, PausingEngine],
) -> None:
    url, engine = server
    call(url, 2)  # generation 2 is the newest this server has seen
    with pytest.raises(StaleGeneration) as refused:
        call(url, 1)
    assert str(refused.value) == (
        f"{url}/pause_generation: pause_generation refused: trainer generation 1 is stale, this server has seen "
        "generation 2 (a newer trainer was started); the stale trainer stops"
    )
    with pytest.raises(StaleGeneration, match="continue_generation refused: trainer generation 1"):
        call(url, 1, "resume")
    with pytest.raises(StaleGeneration, match="init_weights_update_group refused: trainer generation 1"):
        call(url, 1, "init_weights_update_group", master_address="127.0.0.1", master_port=1, world_size=2)
    call(url, 2, "resume")  # the newest goes on
    call(url, None)  # a client without a generation (rlvr eval, a judge) is not fenced
    call(url, 3)
    with pytest.raises(StaleGeneration, match="trainer generation 2 is stale, this server has seen generation 3"):
        call(url, 2)
    assert engine.calls == ["pause abort", "resume", "pause abort", "pause abort"]  # nothing refused reached it


def test_the_weight_sync_stops_on_a_stale_refusal_instead_of_dropping_the_engine(
    server: tuple[str, PausingEngine],
) -> None:
    url, _ = server
    call(url, 2)
    for generation, stale in ((2, False), (1, True)):
        calls = EngineCalls(ServeClient([url], generation=generation), timeout_s=10, on_failure="continue")
        try:
            if stale:
                with pytest.raises(StaleGeneration, match="trainer generation 1 is stale"):
                    calls.call([url], "pause", "pause", "abort")
                assert not calls.dropped  # no engine is blamed for it
            else:
                assert calls.call([url], "pause", "pause", "abort") == []
        finally:
            calls.close()


def test_a_bad_generation_header_is_a_400(server: tuple[str, PausingEngine]) -> None:
    import urllib.error
    import urllib.request

    url, _ = server
    request = urllib.request.Request(url + "/pause_generation", data=b"{}", headers={GENERATION_HEADER: "two"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400


def test_a_trainer_started_as_a_stale_generation_says_so_and_stops_before_it_loads_anything(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    run = RunDir(tmp_path)
    run.next_generation()
    run.next_generation()
    worker = subprocess.run(
        [sys.executable, "-m", "rlvr.worker", "--run-dir", str(tmp_path)],
        env={**os.environ, "RLVR_TRAINER_GENERATION": "1"}, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert worker.returncode == 4, worker.stderr[-2000:]  # FAILED_EXIT: torchrun's wrapper stays quiet
    assert worker.stderr.strip().splitlines()[-1] == (
        f"error: trainer generation 1 is stale: generation 2 owns {tmp_path} now (a newer trainer was started); "
        "the start refused, this trainer stops"
    )
    assert not run.status.exists() and not run.metrics.exists()


def test_a_restarted_server_fences_from_the_runs_record_not_from_the_first_caller(tmp_path: Path) -> None:
    """A server restarted after a trainer restart has seen no call: the run's generation record
    (RLVR_GENERATION_FILE, set by the launcher's supervisor) says generation 2 is the newest, so a
    leftover generation-1 trainer that calls first is still refused."""
    from rlvr.server.fence import GenerationFence

    run = RunDir(tmp_path)
    run.next_generation()
    run.next_generation()
    fence = GenerationFence(record=run.generation_file)
    refused = fence.check("1", method="POST", path="/update_weights_from_distributed")
    assert refused is not None and refused[0] == 409 and "this server has seen generation 2" in refused[1]["message"]
    assert fence.check("1", method="POST", path="/generate") is None  # generation is never fenced
    assert fence.check("2", method="POST", path="/pause_generation") is None
    assert GenerationFence().check("1", method="POST", path="/pause_generation") is None  # no record: calls decide


def test_the_supervisor_points_each_rollout_server_at_the_runs_generation_record(tmp_path: Path) -> None:
    import sys

    from rlvr.launch.supervisor import ServerLaunch, ServerSupervisor
    from rlvr.process import Children
    from rlvr.recipe.plan import ServerSpec

    logs = tmp_path / "logs"
    supervisor = ServerSupervisor(Children(), log=lambda name: logs / f"{name}.log", run_dir=tmp_path / "run")
    printer = [sys.executable, "-c", "import os; print(os.environ.get('RLVR_GENERATION_FILE'))"]
    spec = ServerSpec(index=0, node=0, port=free_port(), gpus=[], engine="embedded")
    supervisor.start(ServerLaunch("rollout-0", printer, {}, "http://127.0.0.1:1", spec)).proc.wait(30)
    supervisor.start(ServerLaunch("judge", printer, {}, "http://127.0.0.1:2")).proc.wait(30)
    assert (logs / "rollout-0.log").read_text().splitlines()[-1] == str(RunDir(tmp_path / "run").generation_file)
    assert (logs / "judge.log").read_text().splitlines()[-1] == "None"  # a judge serves no trainer's weights
