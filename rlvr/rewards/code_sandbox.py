"""`code_sandbox`: run the response's last fenced Python block against the sample's tests.

`sample.case_type` picks how `sample.test_cases` is read:

* `stdin_stdout`: a list of `{"input", "output"}` (or `{"inputs": [...], "outputs": [...]}`);
  each case is a separate sandboxed run of the program; stdout is compared with the expected
  output line by line, trailing whitespace ignored. The host compares, not the sandbox.
* `assert`: a list of assert statements (one case each) or one code string (one case), run
  after the solution in its namespace.
* `pytest`: the text of a pytest file that does `from solution import ...`; the host's pytest
  is bound read-only into the sandbox (a test counts when its call phase passes).
* `check_based`: `{"test": "def check(candidate): ...", "entry_point": "f"}`, HumanEval style:
  `check(f)` passing is the one case.

reward_args: `partial_credit` (default false: all-or-nothing; true: fraction of cases
passed), `timeout_s` (per run, default 10), `memory_mb` (default 512), `max_procs` (32),
`max_output_bytes` (1 MiB), `sandbox` ("local" default, or "e2b"), `sandbox_mode` (local:
"auto" | "bwrap" | "unshare" | "insecure"), `e2b_template`.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import weakref
from dataclasses import dataclass
from importlib import resources
from typing import Any

from rlvr.rewards.args import reject_unknown_args
from rlvr.rewards.base import zero
from rlvr.rewards.registry import register
from rlvr.rewards.sandbox import Limits, RunResult
from rlvr.rewards.text import last_code_block, split_think
from rlvr.types import Completion, RewardResult, Sample

RUNNER = "_rlvr_run.py"
_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
_local_sandboxes: dict[tuple[str, str | None], Any] = {}


@dataclass(slots=True)
class Job:
    """One sandbox run: its files, and for stdin_stdout the expected output the host compares."""

    files: dict[str, str]
    expected: str | None = None
    nonce: str = ""
    total: int = 1
    needs_pytest: bool = False


def _runner_source() -> str:
    return resources.files("rlvr.rewards.sandbox").joinpath("runner.py").read_text()


def build_jobs(sample: Sample, code: str, *, max_procs: int) -> list[Job]:
    """Turn a sample's test cases into sandbox runs; ValueError for a malformed sample."""
    kind, cases = sample.case_type, sample.test_cases
    if isinstance(cases, str) and kind in ("stdin_stdout", "check_based"):
        try:
            cases = json.loads(cases)
        except json.JSONDecodeError as exc:
            raise ValueError(f"test_cases for {kind} is not valid JSON: {exc}") from exc
    runner = _runner_source()

    def job(spec: dict[str, Any], extra: dict[str, str] | None = None, **kw: Any) -> Job:
        nonce = "RLVR-" + secrets.token_hex(12) + ":"
        spec = {"nonce": nonce, "nproc": max_procs + 1, **spec}
        files = {"solution.py": code, RUNNER: runner, "_rlvr_spec.json": json.dumps(spec), **(extra or {})}
        return Job(files=files, nonce=nonce, **kw)

    if kind == "stdin_stdout":
        if isinstance(cases, dict) and "inputs" in cases:
            cases = [{"input": i, "output": o} for i, o in zip(cases["inputs"], cases.get("outputs", []), strict=False)]
        if not isinstance(cases, list) or not cases or not all(isinstance(c, dict) and "input" in c for c in cases):
            raise ValueError("stdin_stdout test_cases must be a non-empty list of {input, output}")
        return [
            job({"mode": "program", "stdin_file": "_stdin.txt"}, {"_stdin.txt": str(c["input"])}, expected=str(c.get("output", "")))
            for c in cases
        ]  # fmt: skip
    if kind == "assert":
        items = [cases] if isinstance(cases, str) else cases
        if not isinstance(items, list) or not items or not all(isinstance(c, str) for c in items):
            raise ValueError("assert test_cases must be a string or a non-empty list of strings")
        return [job({"mode": "assert", "cases": items, "total": len(items)}, total=len(items))]
    if kind == "pytest":
        if not isinstance(cases, str) or not cases.strip():
            raise ValueError("pytest test_cases must be the text of a pytest file")
        return [job({"mode": "pytest", "pylib": "/opt/rlvr-pylib"}, {"test_solution.py": cases}, needs_pytest=True)]
    if kind == "check_based":
        if not isinstance(cases, dict) or "test" not in cases or "entry_point" not in cases:
            raise ValueError('check_based test_cases must be {"test": "def check(candidate): ...", "entry_point": "f"}')
        return [job({"mode": "check", "test": cases["test"], "entry_point": cases["entry_point"]})]
    raise ValueError(
        f"code_sandbox: unsupported case_type {kind!r}; expected stdin_stdout, assert, pytest or check_based"
    )


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _failure(run: RunResult) -> str:
    if run.killed == "timeout":
        return "timeout"
    if run.killed == "output_limit":
        return "output limit exceeded"
    if run.exit_code and run.exit_code < 0:
        return f"killed by signal {-run.exit_code}"
    last = next((line for line in reversed(run.stderr.strip().splitlines()) if line.strip()), "")
    return f"runtime error: {last[:200]}" if last else f"exit code {run.exit_code}"


def judge(job: Job, run: RunResult) -> tuple[int, int, str]:
    """(passed, total, reason) for one run: the host-side half of the verdict."""
    if job.expected is not None:  # stdin_stdout: the host compares stdout
        if run.killed or run.exit_code != 0:
            return 0, 1, _failure(run)
        return (1, 1, "ok") if _lines(run.stdout) == _lines(job.expected) else (0, 1, "wrong answer")
    if run.killed:
        return 0, job.total, _failure(run)
    for line in reversed(run.stdout.splitlines()):
        if line.startswith(job.nonce):
            try:
                verdict = json.loads(line[len(job.nonce) :])
                passed, total = int(verdict["passed"]), int(verdict["total"])
            except (ValueError, KeyError, TypeError):
                break
            errors = verdict.get("errors") or []
            if passed == total and total:
                return passed, total, "ok"
            return passed, total, errors[0] if errors else "no tests ran"
    return 0, job.total, _failure(run) if run.exit_code != 0 else "harness reported nothing (solution exited early?)"


def _semaphore() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _semaphores:
        _semaphores[loop] = asyncio.Semaphore(os.cpu_count() or 1)
    return _semaphores[loop]


async def _run_local(job: Job, limits: Limits, reward_args: dict[str, Any]) -> RunResult:
    from rlvr.rewards.sandbox.local import LocalSandbox, pytest_binds

    key = (str(reward_args.get("sandbox_mode", "auto")), reward_args.get("python"))
    if key not in _local_sandboxes:
        _local_sandboxes[key] = LocalSandbox(mode=key[0], python=key[1])
    sandbox = _local_sandboxes[key]
    binds = pytest_binds() if job.needs_pytest else []
    async with _semaphore():
        return await sandbox.run(job.files, RUNNER, limits=limits, ro_binds=binds)


async def _run_e2b(job: Job, limits: Limits, reward_args: dict[str, Any]) -> RunResult:
    from rlvr.rewards.sandbox.e2b import E2BSandbox

    return await E2BSandbox(template=reward_args.get("e2b_template")).run(job.files, RUNNER, limits=limits)


@register("code_sandbox")
async def score(sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Run the last fenced code block against test cases in a sandbox (local bwrap or E2B)."""
    reject_unknown_args("code_sandbox", reward_args)
    backend = reward_args.get("sandbox", "local")
    if backend not in ("local", "e2b"):
        raise ValueError(f"code_sandbox: sandbox must be 'local' or 'e2b', got {backend!r}")
    limits = Limits(
        timeout_s=float(reward_args.get("timeout_s", 10.0)),
        memory_mb=int(reward_args.get("memory_mb", 512)),
        max_procs=int(reward_args.get("max_procs", 32)),
        max_output_bytes=int(reward_args.get("max_output_bytes", 1 << 20)),
    )
    text = completion.text if isinstance(completion.text, str) else ""
    code = last_code_block(split_think(text)[0])
    if code is None or not code.strip():
        return zero("no code block found")
    try:
        jobs = build_jobs(sample, code, max_procs=limits.max_procs)
    except ValueError as exc:
        return zero(f"bad sample: {exc}", error=True)
    run = _run_e2b if backend == "e2b" else _run_local
    runs = await asyncio.gather(*(run(job, limits, reward_args) for job in jobs))
    verdicts = [judge(job, r) for job, r in zip(jobs, runs, strict=True)]
    passed = sum(v[0] for v in verdicts)
    total = sum(v[1] for v in verdicts)
    failures = [v[2] for v in verdicts if v[0] < v[1] or v[1] == 0]
    info: dict[str, Any] = {"passed": passed, "total": total, "backend": backend}
    if any(r.killed == "timeout" for r in runs):
        info["timeout"] = True
    if total == 0:
        return zero(failures[0] if failures else "no tests ran", **info)
    if passed == total:
        return RewardResult(1.0, {"reason": "all tests passed", **info})
    reason = failures[0] if failures else "failed"
    if reward_args.get("partial_credit", False):
        return RewardResult(passed / total, {"reason": f"{passed}/{total} passed; first failure: {reason}", **info})
    return RewardResult(0.0, {"reason": reason, **info})
