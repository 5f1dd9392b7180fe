from __future__ import annotations

import os
import sys

import pytest

from rlvr.rewards import code_sandbox
from rlvr.rewards.code_blocks import python_blocks
from rlvr.rewards.code_sandbox import score

from .conftest import code_completion, make_completion, make_sample, needs_bwrap

DOUBLE = "def f(x):\n    return 2 * x\n"
WRONG = "def f(x):\n    return x + 2\n"  # right only for x == 2
SAMPLES = {
    "stdin_stdout": (
        [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5", "output": "10"}, {"input": "2 2", "output": "4"}],
        "a, b = map(int, input().split())\nprint(a + b)",
        "a, b = map(int, input().split())\nprint(a * b)",
    ),
    "assert": (["assert f(1) == 2", "assert f(2) == 4", "assert f(5) == 10"], DOUBLE, WRONG),
    "pytest": (
        "from solution import f\n\ndef test_one():\n    assert f(1) == 2\n\ndef test_two():\n    assert f(2) == 4\n",
        DOUBLE,
        WRONG,
    ),
    "check_based": (
        {
            "test": "def check(candidate):\n    assert candidate(3) == 6\n    assert candidate(0) == 0\n",
            "entry_point": "f",
        },
        DOUBLE,
        WRONG,
    ),
}


def test_python_blocks():
    text = "```python\nx = 1\n```\nthen\n```\ny = 2\n```\n```bash\nls\n```"
    assert python_blocks(text) == (["x = 1\n", "y = 2\n"], False)
    assert python_blocks("```python\nunclosed") == (["unclosed"], True)  # the model stopped there
    assert python_blocks("```python\nunclosed", truncated=True) == ([], True)  # cut at the token limit
    assert python_blocks("no code") == ([], False)


@needs_bwrap
@pytest.mark.parametrize("kind", sorted(SAMPLES))
async def test_correct_and_wrong_solution_per_kind(kind):
    cases, good, bad = SAMPLES[kind]
    sample = make_sample(case_type=kind, test_cases=cases)
    right = await score(sample, code_completion(good))
    assert right.score == 1.0, right.info
    wrong = await score(sample, code_completion(bad))
    assert wrong.score == 0.0 and wrong.info["reason"], wrong.info


@needs_bwrap
async def test_partial_credit():
    cases, _, bad = SAMPLES["stdin_stdout"]
    sample = make_sample(case_type="stdin_stdout", test_cases=cases)
    partial = await score(sample, code_completion(bad), partial_credit=True)
    assert partial.score == pytest.approx(1 / 3) and partial.info["passed"] == 1  # only 2*2 == 2+2
    asserts = make_sample(case_type="assert", test_cases=SAMPLES["assert"][0])
    two_of_three = await score(
        asserts, code_completion("def f(x):\n    return 4 if x == 2 else 2 * x if x < 5 else 0"), partial_credit=True
    )
    assert two_of_three.score == pytest.approx(2 / 3)
    pytest_kind = make_sample(case_type="pytest", test_cases=SAMPLES["pytest"][0])
    half = await score(pytest_kind, code_completion(WRONG), partial_credit=True)
    assert half.score == pytest.approx(0.5), half.info


@needs_bwrap
async def test_crashing_and_missing_code():
    sample = make_sample(case_type="assert", test_cases=["assert f(1) == 2"])
    crash = await score(sample, code_completion("raise SystemExit(3)"))
    assert crash.score == 0.0 and "failed to load" in crash.info["reason"]
    none = await score(sample, make_completion("I would write a function."))
    assert none.score == 0.0 and none.info["reason"] == "no code block found"
    bad_sample = await score(make_sample(case_type="stdin_stdout", test_cases="not json"), code_completion("pass"))
    assert bad_sample.score == 0.0 and bad_sample.info["reason"].startswith("bad sample")


@needs_bwrap
async def test_sandbox_python_has_no_host_site_packages():
    sample = make_sample(
        case_type="assert", test_cases=["import importlib.util\nassert importlib.util.find_spec('pydantic') is None"]
    )
    result = await score(sample, code_completion("import sys"))
    assert result.score == 1.0, result.info


def test_insecure_mode_needs_to_be_asked_for(monkeypatch):
    from rlvr.sandbox import local

    monkeypatch.setattr(local.shutil, "which", lambda name: None)
    monkeypatch.setattr(local, "_modes_cache", {})
    monkeypatch.delenv("RLVR_SANDBOX_INSECURE", raising=False)
    with pytest.raises(RuntimeError, match="refusing to run model code unsandboxed"):
        local.available_mode("auto")
    assert local.available_mode("insecure") == "insecure"


# --- E2B: the service is unreachable here, so the SDK class is faked at its boundary. ---


class FakeFiles:
    def __init__(self, log):
        self.log = log
        self.files: dict[str, str] = {}

    async def write(self, path, data, user=None, request_timeout=None):
        self.log.append(("files.write", path))
        self.files[path] = data


class FakeCommands:
    def __init__(self, log, files, behaviour):
        self.log, self.files, self.behaviour = log, files, behaviour

    async def run(self, cmd, background=None, envs=None, user=None, cwd=None, timeout=60, **kw):
        """Run the harness for real (locally, unsandboxed) to produce faithful CommandResults."""
        import subprocess
        import tempfile

        from e2b import CommandExitException, CommandResult, TimeoutException

        self.log.append(("commands.run", cmd, timeout))
        if self.behaviour == "timeout":
            raise TimeoutException("context deadline exceeded")
        with tempfile.TemporaryDirectory() as tmp:
            for path, text in self.files.files.items():
                target = os.path.join(tmp, os.path.relpath(path, "/home/user/rlvr"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "w") as f:
                    f.write(text)
            script = cmd.split()[-1]  # the harness the command runs (_rlvr_run.py or _rlvr_pair.py)
            proc = subprocess.run(
                [sys.executable, "-I", "-S", "-B", script], cwd=tmp, capture_output=True, text=True, timeout=30
            )
        if proc.returncode:
            raise CommandExitException(stderr=proc.stderr, stdout=proc.stdout, exit_code=proc.returncode, error=None)
        return CommandResult(stderr=proc.stderr, stdout=proc.stdout, exit_code=0, error=None)


class FakeAsyncSandbox:
    log: list = []
    behaviour = "run"

    def __init__(self):
        self.sandbox_id = "fake-123"
        self.files = FakeFiles(self.log)
        self.commands = FakeCommands(self.log, self.files, self.behaviour)

    @classmethod
    async def create(cls, template=None, timeout=None, **kw):
        cls.log.append(("create", template, timeout))
        return cls()

    async def kill(self, **opts):
        self.log.append(("kill",))
        return True


@pytest.fixture
def fake_e2b(monkeypatch):
    from rlvr.sandbox import e2b

    FakeAsyncSandbox.log = []
    FakeAsyncSandbox.behaviour = "run"
    monkeypatch.setattr(e2b, "_sdk_class", lambda: FakeAsyncSandbox)
    monkeypatch.setenv("E2B_API_KEY", "test-key")
    return FakeAsyncSandbox


def test_fake_matches_the_real_sdk_signatures():
    import inspect

    from e2b.sandbox_async.commands.command import Commands
    from e2b.sandbox_async.filesystem.filesystem import Filesystem
    from e2b_code_interpreter import AsyncSandbox

    assert {"template", "timeout"} <= set(inspect.signature(AsyncSandbox.create).parameters)
    assert {"cmd", "timeout"} <= set(inspect.signature(Commands.run).parameters)
    assert {"path", "data"} <= set(inspect.signature(Filesystem.write).parameters)
    assert inspect.iscoroutinefunction(AsyncSandbox.kill) or hasattr(AsyncSandbox, "kill")


async def test_e2b_backend_runs_writes_and_kills(fake_e2b):
    cases, good, bad = SAMPLES["assert"]
    sample = make_sample(case_type="assert", test_cases=cases)
    right = await score(sample, code_completion(good), sandbox="e2b", timeout_s=7, e2b_template="py")
    assert right.score == 1.0 and right.info["backend"] == "e2b", right.info
    kinds = [entry[0] for entry in fake_e2b.log]
    assert kinds[0] == "create" and fake_e2b.log[0][1] == "py" and kinds[-1] == "kill"
    assert ("files.write", "/home/user/rlvr/solution/solution.py") in fake_e2b.log
    assert any(e[0] == "commands.run" and e[2] == 7 and "_rlvr_pair.py" in e[1] for e in fake_e2b.log)
    wrong = await score(sample, code_completion(bad), sandbox="e2b")
    assert wrong.score == 0.0
    stdin = make_sample(case_type="stdin_stdout", test_cases=SAMPLES["stdin_stdout"][0])
    crash = await score(stdin, code_completion("raise ValueError('boom')"), sandbox="e2b")
    assert crash.score == 0.0 and "ValueError: boom" in crash.info["reason"]


async def test_e2b_timeout_and_missing_key(fake_e2b, monkeypatch):
    fake_e2b.behaviour = "timeout"
    sample = make_sample(case_type="assert", test_cases=["assert True"])
    result = await score(sample, code_completion("x = 1"), sandbox="e2b")
    assert result.score == 0.0 and result.info["reason"] == "timeout"
    assert fake_e2b.log[-1] == ("kill",)
    monkeypatch.delenv("E2B_API_KEY")
    with pytest.raises(RuntimeError, match="E2B_API_KEY"):
        await score(sample, code_completion("x = 1"), sandbox="e2b")


def test_runner_is_packaged():
    assert "_rlvr_spec.json" in code_sandbox._runner_source()


@pytest.mark.parametrize("mode", ["unshare", "insecure"])
async def test_fallback_modes_run_and_time_out(mode):
    from rlvr.sandbox.local import available_mode

    try:
        available_mode(mode)
    except RuntimeError:
        pytest.skip(f"{mode} is not usable here")
    sample = make_sample(case_type="assert", test_cases=["assert f(1) == 2"])
    assert (await score(sample, code_completion(DOUBLE), sandbox_mode=mode)).score == 1.0
    stuck = await score(sample, code_completion("while True:\n    pass"), sandbox_mode=mode, timeout_s=1)
    assert stuck.score == 0.0 and stuck.info["reason"] == "timeout"
