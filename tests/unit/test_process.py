"""Child processes: logs, health polling, and nothing left behind after kill_all."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from rlvr.process import Children, free_port, is_alive, tree

# A child that starts a grandchild in a new session (so a process-group kill misses it) and waits.
ESCAPING_PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
print("started", "ok", flush=True)
time.sleep(300)
"""


def _wait_until(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_kill_all_takes_down_grandchildren_in_other_sessions(tmp_path: Path) -> None:
    children = Children()
    log = tmp_path / "logs" / "parent.log"
    child = children.start("parent", [sys.executable, "-c", ESCAPING_PARENT], log=log)
    assert _wait_until(lambda: "started ok" in log.read_text())
    grandchildren = tree(child.pid)
    assert len(grandchildren) == 1
    children.kill_all(grace_s=2)
    assert not child.running()
    assert _wait_until(lambda: not any(is_alive(p) for p in grandchildren))
    assert log.read_text().startswith(f"$ {sys.executable} -c")  # the command heads its log


def test_a_child_that_exits_is_reported_with_its_log_tail(tmp_path: Path) -> None:
    children = Children()
    argv = [sys.executable, "-c", "import sys; print('bad config: no model_type'); sys.exit(3)"]
    child = children.start("rollout-0", argv, log=tmp_path / "rollout-0.log")
    problem = child.wait_healthy(f"http://127.0.0.1:{free_port()}", timeout_s=60, poll_s=0.05)
    assert problem is not None
    assert "rollout-0 exited with code 3" in problem and "bad config: no model_type" in problem
    assert len(children.alive()) < len(children.started)


def test_ignored_signals_stay_ignored_in_the_child(tmp_path: Path) -> None:
    """SLURM's time-limit warning reaches every process of a step; a child that does not
    handle it must not die of it."""
    children = Children(ignore=(signal.SIGUSR1,))
    child = children.start(
        "server",
        [sys.executable, "-c", "print('up', 'ok', flush=True); import time; time.sleep(300)"],
        log=tmp_path / "s.log",
    )
    assert _wait_until(lambda: "up ok" in (tmp_path / "s.log").read_text())
    children.signal_workers(signal.SIGUSR1)  # no children of its own: the child itself gets it
    time.sleep(0.3)
    assert child.running()
    children.stop(child, grace_s=2)
    assert child.proc.returncode is not None
