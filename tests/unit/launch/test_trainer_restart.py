"""The trainer's restart on one machine (`LocalLauncher`) and the process tree that lives and dies
together, with a stand-in for torchrun's agent (`fake_agent.py`: a worker in a session of its own,
as torchrun starts them) in place of the real trainer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from rlvr.launch import local
from rlvr.launch.failure import LaunchError
from rlvr.launch.local import LocalLauncher
from rlvr.launch.restarts import Restarts
from rlvr.process import TREE_ENV, Children, is_alive
from rlvr.recipe.load import load_recipe
from rlvr.rundir import RunDir
from tests.conftest import ROOT

QUICKSTART = ROOT / "recipes" / "quickstart.toml"
FAKE_AGENT = Path(__file__).with_name("fake_agent.py")


def wait_for(what: Callable[[], Any], *, timeout_s: float = 30.0, poll: Callable[[], object] | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if poll is not None:
            poll()
        if value := what():
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s")


def record(starts: Path, n: int) -> Callable[[], dict[str, Any] | None]:
    path = starts / f"{n}.json"
    return lambda: json.loads(path.read_text()) if path.exists() else None


def orphaned(pid: int, agent: int) -> bool:
    """`pid` runs and is no longer its agent's child (re-parented: the agent is gone)."""
    try:
        return is_alive(pid) and psutil.Process(pid).ppid() != agent
    except psutil.Error:
        return False


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalLauncher]:
    """A LocalLauncher whose trainer is `fake_agent.py` (its records in tmp/starts), restarts 50 ms apart."""
    starts = tmp_path / "starts"

    def command(plan: object, *, run_dir: Path, resume: str) -> list[str]:
        return [sys.executable, str(FAKE_AGENT), str(starts), resume, "--heartbeat", str(RunDir(run_dir).heartbeat(0))]

    monkeypatch.setattr(local, "trainer_command", command)
    sets = [f"experiment.output_dir={json.dumps(str(tmp_path))}", "rollout.health_deadline_s=1.5"]
    recipe = load_recipe(QUICKSTART, sets)
    launcher = LocalLauncher(recipe, run_dir=tmp_path / "run")
    launcher.trainer.restarts = Restarts(max_restarts=1, backoff_s=0.05)
    try:
        yield launcher
    finally:
        launcher.shutdown(grace_s=1)


def test_a_trainer_whose_agent_is_killed_restarts_as_the_next_generation_once_its_orphan_is_gone(
    launcher: LocalLauncher, tmp_path: Path
) -> None:
    starts, run = tmp_path / "starts", RunDir(tmp_path / "run")
    launcher.trainer.start()
    first = wait_for(record(starts, 1))
    assert (first["generation"], first["restart"], first["resume"]) == ("1", "0", "auto")
    assert run.generation() == 1

    os.kill(first["agent"], signal.SIGKILL)  # the OOM killer's choice: the agent, not the worker
    wait_for(lambda: orphaned(first["worker"], first["agent"]))  # the worker trains on, alone
    wait_for(lambda: launcher.trainer.child is None, poll=launcher.check)  # the death is seen: a restart is due
    assert not is_alive(first["worker"])  # ended at once, not after the backoff
    events = run.events.read_text()
    assert "trainer died with code -9: killed by SIGKILL" in events and "restarting it in" in events

    second = wait_for(record(starts, 2), poll=launcher.check)
    assert (second["generation"], second["restart"], second["resume"]) == ("2", "1", "auto")
    assert run.generation() == 2
    assert is_alive(second["worker"]) and not is_alive(first["worker"])


def test_out_of_restarts_the_run_stops_and_leaves_no_process_of_the_trainer(
    launcher: LocalLauncher, tmp_path: Path
) -> None:
    launcher.trainer.restarts = Restarts(max_restarts=0)
    launcher.trainer.start()
    first = wait_for(record(tmp_path / "starts", 1))
    os.kill(first["agent"], signal.SIGKILL)
    wait_for(lambda: orphaned(first["worker"], first["agent"]))
    with pytest.raises(LaunchError, match="trainer exited with code -9: killed by SIGKILL"):
        wait_for(lambda: launcher.check() is not None)
    launcher.shutdown(grace_s=1)  # what run_local's `finally` does
    assert not is_alive(first["worker"])


def test_a_trainer_rank_stopped_whole_is_told_from_a_slow_one_and_restarted(
    launcher: LocalLauncher, tmp_path: Path
) -> None:
    """SIGSTOP a worker: nothing dies, torchrun sees nothing; its heartbeat goes silent, and past
    `rollout.health_deadline_s` the launcher kills the trainer's tree and restarts it."""
    starts, run = tmp_path / "starts", RunDir(tmp_path / "run")
    launcher.trainer.start()
    first = wait_for(record(starts, 1))
    wait_for(lambda: run.heartbeat(0).exists())
    quiet_until = time.monotonic() + 3 * launcher.trainer.heartbeats.deadline_s  # a beating rank is never hung
    wait_for(lambda: time.monotonic() > quiet_until, poll=launcher.check, timeout_s=10)
    assert launcher.trainer.running() and launcher.trainer.hung is None
    os.kill(first["worker"], signal.SIGSTOP)
    second = wait_for(record(starts, 2), poll=launcher.check)
    assert (second["generation"], second["restart"]) == ("2", "1")
    assert not is_alive(first["worker"]) and not is_alive(first["agent"])
    assert "trainer rank 0 stopped its heartbeat for 1.5 s (hung): killed by SIGKILL" in run.events.read_text()


def test_a_stopped_agent_is_hung_though_its_worker_beats_on(launcher: LocalLauncher, tmp_path: Path) -> None:
    """SIGSTOP torchrun's agent: its worker trains and beats on, but nothing would reap it or see it
    die; past the deadline the launcher kills the tree and restarts the trainer."""
    starts, run = tmp_path / "starts", RunDir(tmp_path / "run")
    launcher.trainer.start()
    first = wait_for(record(starts, 1))
    os.kill(first["agent"], signal.SIGSTOP)
    second = wait_for(record(starts, 2), poll=launcher.check)
    assert (second["generation"], second["restart"]) == ("2", "1")
    assert not is_alive(first["worker"]) and not is_alive(first["agent"])
    assert "trainer agent (torchrun) stopped for 1.5 s (hung): killed by SIGKILL" in run.events.read_text()


def test_a_trainer_asked_to_stop_is_not_restarted_whatever_code_it_ends_with(
    launcher: LocalLauncher, tmp_path: Path
) -> None:
    """Ctrl-C or a preemption (`ask_stop`) makes the next death final: the worker killed by the
    stop signal itself (exit -10) would otherwise look like a crash and train again."""
    launcher.trainer.start()
    wait_for(record(tmp_path / "starts", 1))
    launcher.trainer.ask_stop(signal.SIGUSR1)  # the stand-in worker has no handler: it dies of it
    with pytest.raises(LaunchError, match="trainer exited with code 1: a rank .* was killed by SIGUSR1"):
        wait_for(lambda: launcher.check() is not None)
    time.sleep(0.2)  # past the 50 ms backoff a restart would have waited
    assert launcher.trainer.poll() is not None  # still done: nothing started again
    assert not (tmp_path / "starts" / "2.json").exists()


def test_a_trainer_that_stated_its_own_error_is_not_restarted(launcher: LocalLauncher, tmp_path: Path) -> None:
    """A trainer that stopped the run itself (rewards past their budget, say) would stop it again
    after a restart: the run ends with its own line, not a restart and not a crash report."""
    from rlvr.rundir import write_json_atomic

    run = RunDir(tmp_path / "run")
    launcher.trainer.start()
    first = wait_for(record(tmp_path / "starts", 1))
    write_json_atomic(run.status, {"state": "failed", "error": "math: 9 of 10 rewards could not judge"})
    os.kill(first["agent"], signal.SIGKILL)
    with pytest.raises(LaunchError, match=r"^math: 9 of 10 rewards could not judge$"):
        wait_for(lambda: launcher.check() is not None)
    assert not (tmp_path / "starts" / "2.json").exists()


def test_no_new_trainer_beside_a_process_of_the_last_one_that_outlives_sigkill(
    launcher: LocalLauncher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher.trainer.start()
    first = wait_for(record(tmp_path / "starts", 1))
    real = launcher.children.stop
    monkeypatch.setattr(launcher.children, "stop", lambda child, **kw: [*real(child, **kw), 4242])  # stuck in D
    os.kill(first["agent"], signal.SIGKILL)
    with pytest.raises(LaunchError, match=r"process\(es\) 4242 of the last trainer outlived SIGKILL"):
        wait_for(lambda: launcher.check() is not None)
    assert not (tmp_path / "starts" / "2.json").exists()


@pytest.mark.parametrize("fault", ["agent killed", "rank stopped"])
def test_a_slurm_node_restarts_its_trainer_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """`rlvr.launch.node` (a one-trainer-node job), its agent SIGKILLed or its worker SIGSTOPped:
    the next generation, and only once the last trainer's worker is gone; the attempt records its
    first generation for the other nodes."""
    from rlvr.launch import node as node_module
    from rlvr.recipe.load import resolved_json

    for var in [k for k in os.environ if k.startswith("SLURM")]:
        monkeypatch.delenv(var)
    run, starts = RunDir(tmp_path / "run"), tmp_path / "starts"
    sets = [f"experiment.output_dir={json.dumps(str(tmp_path))}", "experiment.trainer_restarts=1"]
    run.write_recipe(resolved_json(load_recipe(QUICKSTART, [*sets, "rollout.health_deadline_s=1.5"])))
    agent = [sys.executable, str(FAKE_AGENT), str(starts), "auto", "--heartbeat", str(run.heartbeat(0))]
    monkeypatch.setattr(node_module, "trainer_command", lambda plan, **_: agent)
    node = node_module.Node(run.root)
    seen: list[dict[str, Any]] = []

    def kill_each_agent() -> None:
        for n in (1, 2):
            started = wait_for(record(starts, n), timeout_s=60)
            started["last_worker_alive"] = bool(seen) and is_alive(seen[-1]["worker"])
            seen.append(started)
            if fault == "rank stopped" and n == 1:
                wait_for(lambda: run.heartbeat(0).exists())
                os.kill(started["worker"], signal.SIGSTOP)
            else:
                os.kill(started["agent"], signal.SIGKILL)

    import threading

    killer = threading.Thread(target=kill_each_agent, daemon=True)
    killer.start()
    try:
        assert node.run_trainer() == -9  # the second death is past trainer_restarts = 1
    finally:
        killer.join(10)
        node.children.kill_all(grace_s=1)
    assert [(s["generation"], s["restart"]) for s in seen] == [("1", "0"), ("2", "1")]
    assert seen[1]["last_worker_alive"] is False  # the first trainer's worker was gone before the second started
    assert not is_alive(seen[1]["worker"])
    assert json.loads(run.attempt.read_text())["generation"] == 1 and run.generation() == 2
    died = (
        "trainer rank 0 stopped its heartbeat for 1.5 s (hung)"
        if fault == "rank stopped"
        else "trainer died with code -9"
    )
    assert f"{died}: killed by SIGKILL" in run.events.read_text()


def test_a_worker_that_asked_for_it_dies_with_its_agent(tmp_path: Path) -> None:
    children = Children()
    try:
        children.start("trainer", [sys.executable, str(FAKE_AGENT), str(tmp_path), "auto", "--die-with-parent"])
        first = wait_for(record(tmp_path, 1))
        os.kill(first["agent"], signal.SIGKILL)
        wait_for(lambda: not is_alive(first["worker"]), timeout_s=10)
    finally:
        children.kill_all(grace_s=1)


def test_kill_all_ends_the_orphaned_workers_of_a_child_that_died_first(tmp_path: Path) -> None:
    """What a SLURM node's last `kill_all` relies on: a dead agent's worker, in a session of its
    own and re-parented, is still found (by its mark) and killed."""
    children = Children()
    children.start("trainer", [sys.executable, str(FAKE_AGENT), str(tmp_path), "auto"])
    first = wait_for(record(tmp_path, 1))
    os.kill(first["agent"], signal.SIGKILL)
    wait_for(lambda: orphaned(first["worker"], first["agent"]))
    children.kill_all(grace_s=1)
    wait_for(lambda: not is_alive(first["worker"]), timeout_s=5)


def test_a_worker_whose_agent_died_before_it_asked_exits_at_once(tmp_path: Path) -> None:
    """The race `stay_with_parent` closes: a parent outside this process's tree (it lacks the mark
    every process of the tree inherits) is not the agent; the signal would never come."""
    probe = [sys.executable, "-c", "from rlvr.process import stay_with_parent; print(stay_with_parent())"]
    env = {k: v for k, v in os.environ.items() if k != TREE_ENV}
    ours = subprocess.run(probe, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    assert ours.stdout.strip() == "True"  # no mark: any parent but init is the one that started it
    foreign = subprocess.run(probe, env={**env, TREE_ENV: "a-tree-whose-agent-is-gone"}, capture_output=True,
                             text=True, check=True, cwd=ROOT)  # fmt: skip
    assert foreign.stdout.strip() == "False"
    worker = subprocess.run(
        [sys.executable, "-m", "rlvr.worker", "--run-dir", str(tmp_path)],
        env={**env, TREE_ENV: "a-tree-whose-agent-is-gone", "TORCHELASTIC_RUN_ID": "x"},
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert worker.returncode == 1
    assert worker.stderr.strip() == "rlvr.worker: its torchrun agent is gone before it started; exiting"


def test_a_heartbeat_watch_tells_silent_from_slow_ending_and_not_yet_started(tmp_path: Path) -> None:
    from rlvr.launch.health import HeartbeatWatch
    from rlvr.process import Heartbeat

    run = RunDir(tmp_path)
    run.heartbeats.mkdir()
    run.heartbeat(3).write_text("1 57\n")  # the last trainer's rank 3, killed: never beats again
    watch = HeartbeatWatch(run.heartbeats, deadline_s=0.5, ranks=[0, 1, 3])
    watch.restart()
    beating = Heartbeat(run.heartbeat(0), interval_s=0.05).start()
    ending = Heartbeat(run.heartbeat(1), interval_s=0.05).start()
    unwatched = Heartbeat(run.heartbeat(2), interval_s=0.05).start()  # not this watch's rank
    try:
        ending.stop()  # its last word: done
        for _ in range(30):  # 1.5 s, three deadlines: beating, ending, not yet started, not watched
            assert watch.hung() == []
            time.sleep(0.05)
        beating._stop.set()  # noqa: SLF001 - stopped whole: the thread goes silent without a last word
        beating._thread.join()  # noqa: SLF001
        wait_for(lambda: watch.hung() == [0], timeout_s=5)
    finally:
        for heartbeat in (beating, ending, unwatched):
            heartbeat.stop()
