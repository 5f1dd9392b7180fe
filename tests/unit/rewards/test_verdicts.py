"""Failed or scored: only what lies outside the sample may make a verdict "failed".

A failed sample is left out of training, so a policy that could earn "failed" on purpose would
learn to abstain whenever it is unsure. These tests break the sandbox for real (its fork server
killed mid-run, a run whose namespace cannot be set up) and check that those, and only those,
are failed (a job the fork server died under only once it died on every re-run); and that
solutions imitating a sandbox failure (exit code 125, bwrap's messages, killing what they can
reach) score 0 like any other wrong answer.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from rlvr.rewards import code_sandbox
from rlvr.rewards.code_sandbox import score

from .conftest import code_completion, make_sample, needs_bwrap

pytestmark = needs_bwrap

STDIO = {"case_type": "stdin_stdout", "test_cases": [{"input": "", "output": "ok"}]}
ASSERT = {"case_type": "assert", "test_cases": ["assert f(2) == 4"]}

IMPOSTORS = {
    "sys_exit_125": "import sys\nsys.exit(125)",
    "os_exit_125": "import os\nos._exit(125)",
    "bwrap_message": "import sys\nsys.stderr.write('bwrap: Creating new namespace failed: Operation not permitted\\n')\n"
    "sys.exit(1)",
    "kill_pid1": "import os, signal\nos.kill(1, signal.SIGKILL)",
    "kill_everything": "import os, signal\nfor pid in range(1, 300):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
    "    except OSError:\n        pass",
    "close_every_fd": "import os\nos.closerange(0, 1 << 16)\nos._exit(125)",
}


def forkserver_in_use() -> bool:
    return os.geteuid() == 0 and os.environ.get("RLVR_SANDBOX_FORKSERVER", "1") != "0"


@pytest.mark.parametrize("cases", [STDIO, ASSERT], ids=["stdin_stdout", "assert"])
@pytest.mark.parametrize("name", sorted(IMPOSTORS))
async def test_a_solution_imitating_a_sandbox_failure_scores_zero(name, cases):
    body = IMPOSTORS[name] + ("\n\ndef f(x):\n    return x + 1\n" if cases is ASSERT else "")  # wrong either way
    result = await score(make_sample(**cases), code_completion(body), timeout_s=5)
    assert result.judged, result.failed
    assert result.score == 0.0 and result.info["reason"], result.info


@pytest.mark.skipif(not forkserver_in_use(), reason="the fork server runs as root")
@pytest.mark.parametrize("cases", [STDIO, ASSERT], ids=["stdin_stdout", "assert"])
async def test_a_run_whose_namespace_cannot_be_set_up_is_failed(cases):
    # a negative tmpfs size: the mount in the run's pid 1 fails before anything of the solution runs
    result = await score(make_sample(**cases), code_completion("print('ok')"), max_scratch_mb=-1)
    assert result.failed is not None
    assert result.failed.startswith("sandbox could not run the tests: the sandbox could not set up the run")


SLOW_PASS = {  # right, after a second: time for the fork server to die under the run
    "stdin_stdout": (STDIO, "import time\ntime.sleep(1)\nprint('ok')"),
    "assert": (ASSERT, "import time\n\ndef f(x):\n    time.sleep(1)\n    return x * 2\n"),
}


async def kill_the_fork_server(task: asyncio.Future, *, times: int) -> int:
    """SIGKILL the fork server (a fresh one each time) a moment into the runs it has pending, up to
    `times` times or until `task` ends; how many it killed. (A bwrap killed within milliseconds of
    its start can leave its zygote behind, alive, serving the run: not the death tested here.)"""
    killed: set[int] = set()
    while not task.done() and len(killed) < times:
        servers = [s._forkserver for s in code_sandbox._local_sandboxes.values() if s._forkserver is not None]
        proc = next((s.proc for s in servers if s.proc is not None and s.pending), None)
        if proc is not None and proc.pid not in killed and proc.poll() is None:
            await asyncio.sleep(0.3)  # the runs are under way (they take a second)
            proc.kill()
            killed.add(proc.pid)
        await asyncio.sleep(0.02)
    return len(killed)


@pytest.mark.skipif(not forkserver_in_use(), reason="the fork server runs as root")
@pytest.mark.parametrize("kind", sorted(SLOW_PASS))
async def test_a_job_the_fork_server_died_under_is_run_again_and_scored(kind):
    cases, code = SLOW_PASS[kind]
    scoring = asyncio.ensure_future(score(make_sample(**cases), code_completion(code)))
    assert await kill_the_fork_server(scoring, times=1) == 1
    result = await asyncio.wait_for(scoring, timeout=30)
    assert result.judged, result.failed
    assert result.score == 1.0 and result.info["sandbox_reruns"] == 1, result.info
    assert result.info["sandbox_restarts"] == 1  # the re-run brought the fork server back


@pytest.mark.skipif(not forkserver_in_use(), reason="the fork server runs as root")
@pytest.mark.parametrize("kind", sorted(SLOW_PASS))
async def test_a_fork_server_killed_on_every_try_is_failed_and_the_next_run_works(kind):
    cases, code = SLOW_PASS[kind]
    scoring = asyncio.ensure_future(score(make_sample(**cases), code_completion(code)))
    tries = code_sandbox.SANDBOX_RERUNS + 1
    assert await kill_the_fork_server(scoring, times=tries) == tries
    result = await asyncio.wait_for(scoring, timeout=30)
    assert result.failed == "sandbox could not run the tests: the sandbox's fork server died (tried 3 times)"
    assert result.info["error"] and result.info["sandbox_reruns"] == 2
    again = await score(make_sample(**STDIO), code_completion("print('ok')"))
    assert again.judged and again.score == 1.0 and "sandbox_reruns" not in again.info
