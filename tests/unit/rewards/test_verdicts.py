"""Failed or scored: only what lies outside the sample may make a verdict "failed".

A failed sample is left out of training, so a policy that could earn "failed" on purpose would
learn to abstain whenever it is unsure. These tests break the sandbox for real (its fork server
killed mid-run, a run whose namespace cannot be set up) and check that those, and only those,
are failed; and that solutions imitating a sandbox failure (exit code 125, bwrap's messages,
killing what they can reach) score 0 like any other wrong answer.
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


@pytest.mark.skipif(not forkserver_in_use(), reason="the fork server runs as root")
async def test_a_fork_server_killed_mid_run_is_failed_and_the_next_run_works():
    sample = make_sample(**STDIO)
    slow = asyncio.ensure_future(score(sample, code_completion("import time\ntime.sleep(5)\nprint('ok')")))
    server = None
    for _ in range(100):  # the first run starts the fork server
        await asyncio.sleep(0.05)
        servers = [s._forkserver for s in code_sandbox._local_sandboxes.values() if s._forkserver is not None]
        server = next((s for s in servers if s.proc is not None and s.pending), None)
        if server is not None:
            break
    assert server is not None and server.proc is not None
    server.proc.kill()
    result = await asyncio.wait_for(slow, timeout=30)
    assert result.failed == "sandbox could not run the tests: the sandbox's fork server died"
    again = await score(sample, code_completion("print('ok')"))
    assert again.judged and again.score == 1.0
