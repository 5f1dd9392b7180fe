"""One machine: the GPUs split between trainer ranks and rollout servers, or shared (colocated).

Golden plans, the one-line refusals, and a real local launch with stand-in children that
record the CUDA_VISIBLE_DEVICES each was started with and the servers' registration."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlvr.launch.argv import SERVER_MODULE_ENV, WORKER_MODULE_ENV
from rlvr.launch.local import LocalLauncher
from rlvr.recipe.checks import split_problem
from rlvr.recipe.load import load_recipe
from rlvr.recipe.plan import PlanError, make_plan
from rlvr.rendezvous import wait_for_servers

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "quickstart.toml"


def recipe(*overrides: str):
    return load_recipe(RECIPE, list(overrides))


def test_split_gives_the_trainer_the_first_gpus_and_each_server_the_next_block() -> None:
    plan = make_plan(recipe("cluster.gpus_per_node=8", "trainer.ranks=4", "rollout.servers=2",
                            "rollout.engine=vllm", "rollout.vllm.tp_size=2"))  # fmt: skip
    assert plan.trainer_gpus == [0, 1, 2, 3]
    assert [s.gpus for s in plan.servers] == [[4, 5], [6, 7]]
    assert not plan.colocate


def test_colocated_servers_lie_on_the_trainers_gpus() -> None:
    plan = make_plan(recipe("cluster.gpus_per_node=2", "trainer.ranks=2", "rollout.servers=2", "rollout.colocate=true"))
    assert plan.trainer_gpus == [0, 1]
    assert [s.gpus for s in plan.servers] == [[0], [1]]
    assert plan.colocate
    one = make_plan(recipe("cluster.gpus_per_node=1", "rollout.colocate=true"))  # a one-GPU machine
    assert one.trainer_gpus == [0] and one.servers[0].gpus == [0]


def test_a_cpu_machine_gives_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("RLVR_PLAN_GPUS", raising=False)
    plan = make_plan(recipe("rollout.servers=2"))
    assert plan.gpus_per_node == 0 and plan.trainer_gpus == [] and all(not s.gpus for s in plan.servers)


def test_the_visible_gpus_are_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    monkeypatch.delenv("RLVR_PLAN_GPUS", raising=False)
    plan = make_plan(recipe("trainer.ranks=2"))
    assert plan.gpus_per_node == 3 and plan.trainer_gpus == [0, 1] and plan.servers[0].gpus == [2]
    # a trainer rank sees only its own GPUs, yet must make its launcher's plan
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("RLVR_PLAN_GPUS", "3")
    assert make_plan(recipe("trainer.ranks=2")).servers[0].gpus == [2]


def test_a_split_that_does_not_fit_is_refused_in_one_line_naming_the_keys() -> None:
    r = recipe("cluster.gpus_per_node=4", "trainer.ranks=4", "rollout.servers=1")
    with pytest.raises(PlanError) as err:
        make_plan(r)
    message = str(err.value)
    assert "\n" not in message
    for key in ("trainer.ranks = 4", "rollout.servers", "cluster.gpus_per_node = 4", "rollout.colocate"):
        assert key in message
    assert split_problem(r) == (("rollout", "servers"), message)
    tp = recipe("cluster.gpus_per_node=4", "rollout.servers=2", "rollout.engine=vllm", "rollout.vllm.tp_size=4",
                "rollout.colocate=true")  # fmt: skip
    key, line = split_problem(tp) or ((), "")
    assert key == ("rollout", "colocate") and "rollout.servers x rollout.vllm.tp_size = 2 x 4" in line


@pytest.mark.slow  # torchrun and four child processes: ~20 s each
@pytest.mark.parametrize(
    ("overrides", "trainer", "servers"),
    [
        (("trainer.ranks=2", "rollout.servers=2"), ["0,1", "0,1"], ["2", "3"]),
        (("trainer.ranks=2", "rollout.servers=2", "rollout.colocate=true"), ["0,1", "0,1"], ["0", "1"]),
    ],
    ids=["split", "colocated"],
)
def test_a_local_launch_starts_each_child_on_its_gpus_and_registers_the_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...], trainer: list[str], servers: list[str]
) -> None:
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.chdir(ROOT)  # the stand-in children are `python -m tests.unit.launch...`
    monkeypatch.setenv("ONEBOX_RECORD", str(record))
    monkeypatch.setenv(WORKER_MODULE_ENV, "tests.unit.launch.fake_gpu_child")
    monkeypatch.setenv(SERVER_MODULE_ENV, "tests.unit.launch.fake_gpu_child")
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    r = recipe("cluster.gpus_per_node=4", *overrides)
    run_dir = tmp_path / "run"
    launcher = LocalLauncher(r, run_dir=run_dir, resume="none")
    try:
        launcher.start(server_timeout_s=60)
        registered = wait_for_servers(run_dir, count=2, timeout_s=30)
        assert launcher.wait(poll_s=0.2) == 0
    finally:
        launcher.shutdown(grace_s=5)
    assert [s.gpus for s in sorted(registered, key=lambda s: s.index)] == [[int(x)] for x in servers]
    ports = {s.index: int(s.url.rsplit(":", 1)[1]) for s in registered}
    assert len(set(ports.values())) == 2  # free ports: two runs on one machine do not collide
    for index, gpus in enumerate(servers):
        seen = json.loads((record / f"server-{ports[index]}.json").read_text())
        assert seen["CUDA_VISIBLE_DEVICES"] == gpus and seen["RLVR_PLAN_GPUS"] == "4"
    for rank in range(2):
        seen = json.loads((record / f"rank-{rank}.json").read_text())
        assert seen["CUDA_VISIBLE_DEVICES"] == trainer[rank] and seen["LOCAL_RANK"] == str(rank)
