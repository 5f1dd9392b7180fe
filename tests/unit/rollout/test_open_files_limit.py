"""RLIMIT_NOFILE is raised to the hard limit where sockets pile up: `rlvr serve` and the trainer
ranks (rank 0 holds the rollout client's connections, the judges' and the sandboxes' pipes)."""

from __future__ import annotations

import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

resource = pytest.importorskip("resource")

SCRIPT = """
import resource
from rlvr.process import OPEN_FILES_CAP, raise_open_files_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
got = raise_open_files_limit()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = OPEN_FILES_CAP if hard == resource.RLIM_INFINITY else hard
print(got, soft, want)
"""


def test_the_soft_limit_goes_up_to_the_hard_one() -> None:
    """In a child (the limit is per process): soft lowered to 64, then raised to the hard limit
    (capped where the kernel refuses more)."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    got, soft, want = map(int, out.split())
    assert got == soft and (soft == want or soft >= 10240)  # 10240: the fallback where the cap is refused


def test_rlvr_serve_and_the_worker_raise_it_before_anything_else(monkeypatch) -> None:
    import rlvr.process
    import rlvr.server.routes as server
    import rlvr.worker as worker

    calls: list[str] = []
    monkeypatch.setattr(rlvr.process, "raise_open_files_limit", lambda: calls.append("raised") or 1)
    monkeypatch.setattr(server.web, "run_app", lambda *a, **k: calls.append("served"))
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        server.run_server(SimpleNamespace(model_path="m"), sock=sock)
    finally:
        sock.close()
    assert calls == ["raised", "served"]

    class Raised(Exception):
        pass

    def first() -> int:
        raise Raised

    monkeypatch.setattr(rlvr.process, "raise_open_files_limit", first)
    with pytest.raises(Raised):  # before the arguments are even parsed
        worker.main(["--bogus"])
