"""The rollout servers' supervisor: GPU mapping, each server's argv and env on one machine and on
a SLURM node, health, deaths reported once, and the bounded restart budget, with real processes."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rlvr.launch.argv import SERVER_MODULE_ENV, judge_command, server_command
from rlvr.launch.failure import LaunchError, failure
from rlvr.launch.health import HealthWatch
from rlvr.launch.restarts import Restarts
from rlvr.launch.supervisor import (
    ServerLaunch,
    ServerSupervisor,
    colocate_flags,
    judge_launch,
    register,
    rollout_launch,
    server_name,
    visible_devices,
)
from rlvr.process import Children, free_port
from rlvr.recipe.load import load_recipe
from rlvr.recipe.plan import ServerSpec, make_plan
from rlvr.rendezvous import read_servers, server_instances
from rlvr.rundir import RunDir
from tests.conftest import ROOT

QUICKSTART = ROOT / "recipes" / "quickstart.toml"
FLAGSHIP = ROOT / "recipes" / "math_code_judge.toml"

HEALTHY = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def test_child_gpu_lists_follow_the_launchers_own_visible_devices() -> None:
    assert visible_devices([0, 1], parent="4,5,6,7") == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert visible_devices([2], parent="") == {"CUDA_VISIBLE_DEVICES": "2"}
    assert visible_devices([], parent="4") == {}
    assert colocate_flags("vllm") == ["--enable-sleep-mode"]
    assert colocate_flags("sglang") == ["--enable-memory-saver"]
    assert colocate_flags("embedded") == []


def test_cuda_visible_devices_map_through_slurms_list() -> None:
    assert visible_devices([0, 1], parent="") == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert visible_devices([1], parent="4,5,6,7") == {"CUDA_VISIBLE_DEVICES": "5"}
    with pytest.raises(LaunchError, match=r"plan GPUs \[4\] but this node only sees CUDA_VISIBLE_DEVICES=0,1"):
        visible_devices([4], parent="0,1")


def test_a_local_server_binds_and_is_reached_on_loopback_with_its_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SERVER_MODULE_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    recipe = load_recipe(QUICKSTART, ["rollout.engine=vllm", "rollout.colocate=true", "cluster.gpus_per_node=3"])
    spec = make_plan(recipe).servers[0]
    launch = rollout_launch(recipe, spec, colocate=True, prompt_tokens=30)
    assert launch.name == server_name(0) == "rollout-0" and launch.spec == spec
    assert launch.argv == [*server_command(recipe, spec, prompt_tokens=30), "--enable-sleep-mode"]
    assert launch.env == {"CUDA_VISIBLE_DEVICES": "3"}
    assert launch.url == f"http://127.0.0.1:{spec.port}"
    monkeypatch.setenv(SERVER_MODULE_ENV, "tests.unit.launch.fake_gpu_child")  # a stand-in takes no engine flags
    assert "--enable-sleep-mode" not in rollout_launch(recipe, spec, colocate=True).argv


def test_a_slurm_node_server_binds_its_host_and_advertises_its_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SERVER_MODULE_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7,8,9,10,11")
    recipe = load_recipe(FLAGSHIP, ["cluster.nodes=4"])
    spec = make_plan(recipe).servers[9]  # the second server of the second rollout node
    launch = rollout_launch(recipe, spec, host="0.0.0.0", advertise="10.0.0.3", env={"RLVR_NODE_ROLE": "rollout"})
    assert (launch.name, spec.gpus) == ("rollout-9", [1])
    assert launch.argv == server_command(recipe, spec, host="0.0.0.0")
    assert launch.env == {"RLVR_NODE_ROLE": "rollout", "CUDA_VISIBLE_DEVICES": "5"}
    assert launch.url == f"http://10.0.0.3:{spec.port}"
    judged = load_recipe(QUICKSTART)  # the flagship's judge is a remote one
    judge = judge_launch(judged, port=30100, host="0.0.0.0", advertise="10.0.0.3", env={"RLVR_NODE_ROLE": "rollout"})
    assert (judge.name, judge.spec, judge.url, judge.env) == (
        "judge",
        None,
        "http://10.0.0.3:30100",
        {"RLVR_NODE_ROLE": "rollout"},
    )
    assert judge.argv == judge_command(judged, host="0.0.0.0", port=30100)


def server(index: int, script: str) -> ServerLaunch:
    """A stand-in server: `script` runs with its port as its one argument."""
    spec = ServerSpec(index=index, node=0, port=free_port())
    argv = [sys.executable, "-c", script, str(spec.port)]
    return ServerLaunch(server_name(index), argv, {}, f"http://127.0.0.1:{spec.port}", spec)


def supervisor(tmp_path: Path, restarts: Restarts | None = None, **options: Any) -> ServerSupervisor:
    """A supervisor whose logs go under `tmp_path` (`options`: its other fields)."""
    return ServerSupervisor(Children(), log=RunDir(tmp_path).log, restarts=restarts, **options)


def wait_dead(servers: ServerSupervisor, timeout_s: float = 30.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = servers.dead()
        if dead:
            return dead
        time.sleep(0.05)
    return []


def test_a_dead_server_is_restarted_on_its_port_within_its_budget(tmp_path: Path) -> None:
    servers = supervisor(tmp_path, Restarts(max_restarts=1, backoff_s=0.05))
    try:
        launch = server(0, "import sys; sys.exit(3)")
        first = servers.start(launch)
        assert wait_dead(servers) == [first] and servers.dead() == []  # each death reported once
        assert servers.up() == 0
        plan = servers.died(first)
        assert plan is not None and plan.startswith("restarting it in 0.05 s (attempt 1 of 1)")
        assert servers.restart_due() == []  # not yet
        time.sleep(0.06)
        fresh = servers.restart_due()
        assert [c.name for c in fresh] == ["rollout-0"] and fresh[0].pid != first.pid
        assert servers.current["rollout-0"] is fresh[0] and fresh[0].proc.args == launch.argv
        assert wait_dead(servers) == fresh
        assert servers.died(fresh[0]) is None  # out of restarts
        assert (tmp_path / "logs" / "rollout-0.log").read_text().count("$ ") == 2  # one log, both starts
    finally:
        servers.stop(grace_s=2)


def test_without_restarts_nothing_is_restarted_and_the_judge_has_its_own_budget(tmp_path: Path) -> None:
    judge = ServerLaunch("judge", [sys.executable, "-c", "pass"], {}, "http://127.0.0.1:9")
    for restarts, judge_restarts, launch, restarted in [
        (None, None, server(0, "pass"), False),
        (Restarts(backoff_s=0.01), None, judge, False),  # rollout servers' budget is not the judge's
        (None, Restarts(backoff_s=0.01), judge, True),
    ]:
        servers = supervisor(tmp_path, restarts, judge_restarts=judge_restarts)
        try:
            child = servers.start(launch)
            assert wait_dead(servers) == [child]
            plan = servers.died(child)
            assert (plan is not None) == restarted
            if restarted:
                assert plan == "restarting it in 0.01 s (attempt 1 of 3); what it was judging is judged again"
                time.sleep(0.02)
                assert [c.name for c in servers.restart_due()] == ["judge"]
        finally:
            servers.stop(grace_s=2)


def test_a_restarted_server_is_registered_again_one_instance_on_before_it_starts(tmp_path: Path) -> None:
    servers = supervisor(tmp_path, Restarts(backoff_s=0.01), run_dir=tmp_path, host="node7")
    try:
        launch = server(0, "import time; time.sleep(0.2)")
        register(tmp_path, launch)  # as the launcher does once it is healthy
        first = servers.start(launch)
        assert [a.instance for a in read_servers(tmp_path)] == [0]
        assert wait_dead(servers) == [first] and servers.died(first) is not None
        time.sleep(0.02)
        [fresh] = servers.restart_due()
        [address] = read_servers(tmp_path)
        assert (address.url, address.instance, address.host) == (launch.url, 1, "node7")
        assert fresh.pid != first.pid and server_instances(tmp_path) == {launch.url: 1}
    finally:
        servers.stop(grace_s=2)


def test_a_hung_server_is_killed_and_said_so_while_a_slow_one_is_left_alone(tmp_path: Path) -> None:
    watch = HealthWatch(deadline_s=1.0, interval_s=0.1)
    servers = supervisor(tmp_path, health=watch)
    try:
        hung, slow = servers.start(server(0, HEALTHY)), servers.start(server(1, HEALTHY))
        assert servers.wait_healthy(timeout_s=60, poll_s=0.05)
        time.sleep(0.3)  # both answered the watch once
        os.kill(hung.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 20
        dead: list = []
        while not dead and time.monotonic() < deadline:
            servers.kill_hung()
            dead = servers.dead()
            time.sleep(0.1)
        assert dead == [hung] and slow.running()
        assert servers.why(hung) == "stopped answering /health for 1 s (hung)"
        assert str(failure(hung, servers.why(hung))).startswith(
            "rollout-0 stopped answering /health for 1 s (hung): killed by SIGKILL (log: "
        )
        assert servers.why(slow) == f"died with code {slow.proc.returncode}"
    finally:
        servers.stop(grace_s=2)


def test_a_server_still_starting_is_not_hung(tmp_path: Path) -> None:
    """Only a server that answered once since its (re)start can hang: loading a model is not hanging."""
    watch = HealthWatch(deadline_s=0.3, interval_s=0.1)
    servers = supervisor(tmp_path, health=watch)
    try:
        child = servers.start(server(0, "import time; time.sleep(30)"))
        time.sleep(1.0)
        servers.kill_hung()
        assert child.running() and watch.hung() == []
    finally:
        servers.stop(grace_s=2)


def test_wait_healthy_reports_each_healthy_server_and_the_root_cause_of_one_that_exits(tmp_path: Path) -> None:
    servers = supervisor(tmp_path)
    try:
        servers.start(server(0, HEALTHY))
        seen: list[str] = []
        assert servers.wait_healthy(timeout_s=60, poll_s=0.05, on_healthy=lambda launch: seen.append(launch.name))
        assert seen == ["rollout-0"] and servers.healthy("rollout-0") and servers.up() == 1
        assert servers.wait_healthy(timeout_s=60, stop=lambda: True) is False  # given up at once
        servers.start(server(1, "import sys; sys.exit('OSError: not a model folder')"))
        with pytest.raises(LaunchError) as caught:
            servers.wait_healthy(timeout_s=60, poll_s=0.05)
        message = str(caught.value)
        assert message.startswith("rollout-1 exited with code 1 before it was healthy: OSError: not a model folder")
        assert str(tmp_path / "logs" / "rollout-1.log") in message
    finally:
        servers.stop(grace_s=2)
    assert servers.up() == 0


def test_a_server_that_never_answers_times_out(tmp_path: Path) -> None:
    servers = supervisor(tmp_path)
    try:
        launch = server(2, "import time; time.sleep(300)")
        servers.start(launch)
        with pytest.raises(LaunchError, match=rf"rollout-2 was not healthy at {launch.url} after 0s"):
            servers.wait_healthy(timeout_s=0.2, poll_s=0.05)
    finally:
        servers.stop(grace_s=2)


def test_register_announces_servers_and_the_judge(tmp_path: Path) -> None:
    spec = ServerSpec(index=3, node=1, port=30003, gpus=[2], engine="sglang")
    register(tmp_path, ServerLaunch("rollout-3", [], {}, "http://10.0.0.3:30003", spec), host="node2")
    register(tmp_path, ServerLaunch("judge", [], {}, "http://10.0.0.3:30100"))
    [address] = read_servers(tmp_path)
    assert (address.index, address.url, address.engine, address.host, address.gpus) == (
        3, "http://10.0.0.3:30003", "sglang", "node2", [2],
    )  # fmt: skip
    assert RunDir(tmp_path).judge.read_text() == "http://10.0.0.3:30100"
    assert json.loads(RunDir(tmp_path).server(3).read_text())["host"] == "node2"
