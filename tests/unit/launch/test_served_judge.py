"""`served_judge`: the judge `rlvr eval` serves the way `rlvr launch` does, and always stops."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from rlvr.launch import supervisor
from rlvr.launch.local import LaunchError, served_judge
from rlvr.process import is_healthy

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


def fake_judge(monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    def command(recipe, *, host: str, port: int) -> list[str]:
        return [sys.executable, "-c", script, str(port)]

    monkeypatch.setattr(supervisor, "judge_command", command)


def test_a_healthy_judge_is_served_then_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_judge(monkeypatch, HEALTHY)
    with served_judge(SimpleNamespace(), log=tmp_path / "judge.log", timeout_s=60) as url:
        assert is_healthy(url)
        pids = [p.pid for p in psutil.process_iter(["cmdline"]) if HEALTHY in (p.info["cmdline"] or [])]
        assert len(pids) == 1
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
    assert not is_healthy(url)


def test_a_judge_that_dies_raises_its_root_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_judge(monkeypatch, "import sys; sys.exit('OSError: judge-model is not a model folder')")
    with (
        pytest.raises(LaunchError) as caught,
        served_judge(SimpleNamespace(), log=tmp_path / "judge.log", timeout_s=60),
    ):
        pytest.fail("the body must not run without a judge")
    message = str(caught.value)
    assert message.startswith("judge exited with code 1 before it was healthy: ")
    assert "OSError: judge-model is not a model folder" in message and str(tmp_path / "judge.log") in message
