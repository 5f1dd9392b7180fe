"""Hostile programs against the local sandbox: each is contained AND scores 0 with a reason.

Runs through the public reward (`code_sandbox.score`) so what is tested is what training
uses. "Contained" is checked on the host: files absent, listener untouched, the test's own
processes alive, and no process of a sandbox uid (>= 100000, picked per run) left behind.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from rlvr.rewards.code_sandbox import score

from .conftest import code_completion, make_sample, needs_bwrap

pytestmark = needs_bwrap


# Orphans of anything we start are reparented to this process, not to init, so "descends from
# this test process" stays true for a process that escapes its sandbox's pid namespace: that is
# what tells our sandboxes' processes from other test sessions' on a shared machine.
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def sandbox_processes() -> list[int]:
    """Live descendants of this test process whose real uid is in the sandbox range."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("State", "").strip().startswith("Z"):  # already dead, waiting to be reaped
            continue
        table[int(entry.name)] = (int(fields["PPid"]), int(fields.get("Uid", "0").split()[0]))

    def ours(pid: int) -> bool:
        for _ in range(64):
            pid = table.get(pid, (0, 0))[0]
            if pid == os.getpid():
                return True
            if pid <= 1:
                return False
        return False

    return [pid for pid, (_, uid) in table.items() if uid >= 100_000 and ours(pid)]


def assert_no_leftovers() -> None:
    for _ in range(40):
        if not sandbox_processes():
            return
        time.sleep(0.05)
    raise AssertionError(f"sandbox processes survived the run: {sandbox_processes()}")


async def run(code: str, *, expected: str = "ok", **args):
    sample = make_sample(case_type="stdin_stdout", test_cases=[{"input": "", "output": expected}])
    args.setdefault("timeout_s", 5)
    result = await score(sample, code_completion(code), **args)
    assert result.score == 0.0, result.info
    assert result.judged, result.failed  # whatever the code does is its own 0, never "could not judge"
    assert result.info.get("reason") and result.info["reason"] != "all tests passed"
    assert_no_leftovers()
    return result


async def test_fork_bomb():
    result = await run("import os\nwhile True:\n    os.fork()", timeout_s=3, max_procs=16)
    # It dies of the process limit one way or another: a timeout, fork() failing, or the
    # interpreter failing as the limit bites (the reason is then the traceback's first line).
    reason = result.info["reason"]
    assert reason == "timeout" or "BlockingIOError" in reason or "Resource" in reason or "runtime error" in reason
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


async def test_busy_loop_times_out():
    result = await run("while True:\n    pass", timeout_s=1)
    assert result.info["reason"] == "timeout"


async def test_ignoring_sigterm_does_not_help():
    code = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    result = await run(code, timeout_s=1)
    assert result.info["reason"] == "timeout"


async def test_memory_bomb():
    result = await run("chunks = []\nwhile True:\n    chunks.append(bytearray(50_000_000))", memory_mb=256)
    assert "MemoryError" in result.info["reason"] or "killed" in result.info["reason"], result.info


async def test_writes_outside_scratch_do_not_reach_the_host(tmp_path):
    name = f"pwned-{uuid.uuid4().hex}"
    targets = [f"/tmp/{name}", str(tmp_path / name), f"{os.path.expanduser('~')}/{name}", f"/usr/{name}"]
    code = f"targets = {targets!r}\nfor t in targets:\n    open(t, 'w').write('x')\nprint('ok')"
    await run(code)
    for target in targets:
        assert not os.path.exists(target), target


async def test_host_secrets_are_not_readable(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    os.chmod(secret, 0o644)
    await run(f"print(open({str(secret)!r}).read())", expected="hunter2")
    await run(
        "print(open('/etc/shadow').read()[:10])",
        expected=Path("/etc/shadow").read_text()[:10] if os.access("/etc/shadow", os.R_OK) else "x",
    )
    result = await run("import os\nprint(sorted(os.listdir('/')))", expected="anything")
    assert result.info["reason"] == "wrong answer"


async def test_no_network_to_the_host():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    try:
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'hi')\nprint('ok')"
        result = await run(code)
        assert "Connection" in result.info["reason"] or "OSError" in result.info["reason"], result.info
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


async def test_killing_the_parent_and_everything_reachable():
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\nprint('ok')"
        await run(code, expected="survived")
        assert bystander.poll() is None  # a host process next to the test is still alive
    finally:
        bystander.kill()
        bystander.wait()


async def test_huge_output_is_bounded():
    # A long timeout: the flood must be stopped by the output cap, never by the clock (a loaded
    # machine can take seconds to start a sandbox, and then the reason would read "timeout").
    result = await run("while True:\n    print('x' * 10000)", max_output_bytes=100_000, timeout_s=60)
    assert result.info["reason"] == "output limit exceeded: stdout (max_output_bytes = 100000)"
    noisy = await run(
        "import sys\nwhile True:\n    sys.stderr.write('x' * 10000)", max_output_bytes=100_000, timeout_s=60
    )
    assert noisy.info["reason"] == "output limit exceeded: stderr (max_output_bytes = 100000)"
    judged = make_sample(case_type="assert", test_cases=["assert f(1) == 1"])  # the judged kinds say so too
    flood = "import sys\nsys.stderr.write('x' * 300_000)\ndef f(x):\n    return x"
    result = await score(judged, code_completion(flood), max_output_bytes=100_000, timeout_s=60)
    assert result.score == 0.0 and result.info["reason"] == "output limit exceeded: stderr (max_output_bytes = 100000)"


async def test_setsid_and_double_fork_leave_nothing_behind():
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        open('child.pid', 'w').write(str(os.getpid()))\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('escaped')\n"
    )
    await run(code, expected="ok")  # prints 'escaped', exits 0; the grandchild must die with the namespace


async def contained(code: str, **args) -> None:
    """A program that checks a containment property from inside and prints `contained`."""
    sample = make_sample(case_type="stdin_stdout", test_cases=[{"input": "", "output": "contained"}])
    result = await score(sample, code_completion(code), **{"timeout_s": 20, **args})
    assert result.score == 1.0, result.info
    assert_no_leftovers()


async def test_sandbox_pid1_and_the_run_have_an_empty_environment(monkeypatch):
    monkeypatch.setenv("RLVR_TEST_API_KEY", "hunter2-secret")
    code = (
        "import os\n"
        "seen = b''\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            seen += open(f'/proc/{pid}/environ', 'rb').read()\n"
        "        except OSError:\n"
        "            pass\n"
        "leak = b'hunter2' in seen or any('hunter2' in v for v in os.environ.values())\n"
        "print('leaked' if leak else 'contained')"
    )
    await contained(code)


async def test_total_bytes_written_are_bounded():
    # 320 MB offered to every writable-looking place; the sandbox takes at most max_scratch_mb in all.
    code = (
        "import os\n"
        "total = 0\n"
        "chunk = b'x' * (1 << 20)\n"
        "for n, d in enumerate(('.', '/tmp', '/', '/dev', '/dev/shm', '/sandbox')):\n"
        "    for i in range(64):\n"
        "        try:\n"
        "            with open(os.path.join(d, f'f{n}-{i}'), 'wb') as f:\n"
        "                for _ in range(5):\n"
        "                    f.write(chunk)\n"
        "                    f.flush()\n"
        "                    total += len(chunk)\n"
        "        except OSError:\n"
        "            break\n"
        "print('contained' if total <= 17 * (1 << 20) else f'wrote {total}')"
    )
    await contained(code, memory_mb=128, max_scratch_mb=16)


async def test_stderr_follows_max_output_bytes():
    # A correct program that is chatty on stderr (200 KB, past the old hard 64 KiB cap) still passes.
    await contained("import sys\nsys.stderr.write('debug ' * 35000)\nprint('contained')")
