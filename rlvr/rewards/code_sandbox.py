"""`code_sandbox`: run the response's program against the sample's tests.

The program is found among the response's fenced Python blocks by `code_blocks.find_program`; a
response cut inside a fence at the token limit scores 0. `sample.case_type` says how
`sample.test_cases` is read: `stdin_stdout` (input/output pairs, each a sandboxed run, stdout
compared on the host), `assert`, `pytest` or `check_based` (HumanEval style). The three test kinds
are judged in a SEPARATE sandboxed judge process (`sandbox/judge.py`) that calls the solution's
functions over a pipe and gets plain values back (`sandbox/wire.py`), so nothing the solution does
in its own process reaches the verdict. A job the fork server died under is run again, whole, up
to `SANDBOX_RERUNS` more times before its verdict is *failed*.

reward_args: `partial_credit`, `timeout_s`, `memory_mb`, `max_procs`, `max_output_bytes`,
`max_scratch_mb`, `sandbox`, `sandbox_mode`, `e2b_template` (docs/rewards.md, code_sandbox).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from rlvr.recipe.machine import cpu_cores
from rlvr.rewards.args import reject_unknown_args
from rlvr.rewards.base import failed, zero
from rlvr.rewards.cases import normalise_test_cases
from rlvr.rewards.code_blocks import find_program
from rlvr.rewards.deadline import queued
from rlvr.rewards.registry import register
from rlvr.rewards.text import model_text, split_think
from rlvr.sandbox import SANDBOX_FAILURES, Limits, RunResult
from rlvr.types import Completion, RewardResult, Sample

RUNNER = "_rlvr_run.py"
JUDGE = "_rlvr_judge.py"
WIRE = "_rlvr_wire.py"
PAIR = "_rlvr_pair.py"
_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
_local_sandboxes: dict[tuple[str, str | None], Any] = {}
SANDBOX_RERUNS = 2
"""How many more times a job runs after the fork server died under it (`sandbox_lost`): the server
restarts itself on the next run, and what it was running must be judged again, not failed. Only
that failure is retried; `sandbox_setup` would fail the same way again. The verdict is still the
sandbox judge's, and a solution cannot reach the fork server from its namespaces; were it able to,
the bounded re-runs end in a failed verdict, which earns it nothing."""
Verdict = tuple[int, int, str, RunResult]


@dataclass(slots=True)
class Job:
    """One sandbox run: the solution's files, and either the expected stdout (stdin_stdout,
    compared on the host) or the judge's files (test modes, judged in a separate process)."""

    files: dict[str, str]
    expected: str | None = None
    judge_files: dict[str, str] | None = None
    total: int = 1
    needs_pytest: bool = False


@functools.cache
def _harness(name: str) -> str:
    """A harness file's text, read once per process: every sample's jobs carry it, and a file read
    per sample would be blocking I/O on the rollout manager's event loop."""
    return resources.files("rlvr.sandbox").joinpath(name).read_text()


def _runner_source() -> str:
    return _harness("runner.py")


def build_jobs(sample: Sample, code: str, *, max_procs: int, max_reply_bytes: int = 1 << 20) -> list[Job]:
    """Turn a sample's test cases into sandbox runs; ValueError for a malformed sample (the shape
    rule is `rewards/cases.py`'s, which data loading already applied to every row)."""
    kind = sample.case_type
    cases = normalise_test_cases(kind, sample.test_cases)
    wire = _harness("wire.py")

    def solution(mode: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        spec = json.dumps({"mode": mode, "nproc": max_procs + 1, "stdin_file": "_stdin.txt" if extra else None})
        return {"solution.py": code, RUNNER: _runner_source(), WIRE: wire, "_rlvr_spec.json": spec, **(extra or {})}

    def judged(spec: dict[str, Any], total: int, extra: dict[str, str] | None = None, **kw: Any) -> Job:
        spec = {**spec, "max_reply_bytes": max_reply_bytes}
        judge = {JUDGE: _harness("judge.py"), WIRE: wire, "_rlvr_spec.json": json.dumps(spec), **(extra or {})}
        return Job(files=solution("serve"), judge_files=judge, total=total, **kw)

    if kind == "stdin_stdout":
        return [
            Job(files=solution("program", {"_stdin.txt": str(c["input"])}), expected=str(c.get("output", "")))
            for c in cases
        ]
    if kind == "assert":
        return [judged({"mode": "assert", "cases": cases}, len(cases))]
    if kind == "pytest":
        spec = {"mode": "pytest", "pylib": "/opt/rlvr-pylib", "test_file": "test_solution.py"}
        return [judged(spec, 0, {"test_solution.py": cases}, needs_pytest=True)]
    spec = {
        "mode": "check",
        "test": cases["test"],
        "entry_point": cases["entry_point"],
        "prelude": cases.get("prelude"),
    }
    return [judged(spec, 1)]


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _failure(run: RunResult, limits: Limits | None = None) -> str:
    cap = f" (max_output_bytes = {limits.max_output_bytes})" if limits else ""
    if run.killed == "timeout":
        return "timeout"
    if run.killed in ("stdout_limit", "output_limit"):
        return f"output limit exceeded: stdout{cap}"
    if run.killed == "stderr_limit":
        return f"output limit exceeded: stderr{cap}"
    if run.exit_code and run.exit_code < 0:
        return f"killed by signal {-run.exit_code}"
    last = next((line for line in reversed(run.stderr.strip().splitlines()) if line.strip()), "")
    return f"runtime error: {last[:200]}" if last else f"exit code {run.exit_code}"


def judge_program(job: Job, run: RunResult, limits: Limits | None = None) -> tuple[int, int, str]:
    """stdin_stdout: the host compares stdout line by line."""
    if run.killed or run.exit_code != 0:
        return 0, 1, _failure(run, limits)
    return (1, 1, "ok") if _lines(run.stdout) == _lines(job.expected or "") else (0, 1, "wrong answer")


def judge_events(
    job: Job, judge_run: RunResult, solution_run: RunResult | None, limits: Limits | None = None
) -> tuple[int, int, str]:
    """(passed, total, reason) from the judge's event lines; cases it never reported failed."""
    results: dict[int, tuple[bool, str]] = {}
    done, load_error = False, None
    for line in judge_run.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if "case" in event:
            results[int(event["case"])] = (bool(event.get("ok")), str(event.get("error", "")))
        done = done or bool(event.get("done"))
        load_error = load_error or event.get("load_error")
    total = max(job.total, len(results))
    passed = sum(ok for ok, _ in results.values())
    if solution_run is not None and solution_run.killed in ("stdout_limit", "stderr_limit"):
        # Past the output cap is a 0 whatever the judge saw: the kill lands a moment after the cap
        # is crossed, and a solution may finish answering the judge in that moment.
        return 0, max(total, 1), _failure(solution_run, limits)
    sol_killed = solution_run is not None and solution_run.killed == "timeout"
    if sol_killed and solution_run is not None and (passed < total or load_error):  # the cause, not the symptom
        return passed, max(total, 1), _failure(solution_run, limits)
    if load_error:
        return 0, max(total, 1), str(load_error)
    if not done and judge_run.killed:
        return passed, max(total, 1), _failure(judge_run, limits)
    if not done:
        return passed, max(total, 1), "judge error: " + _failure(judge_run, limits)
    if total == 0:
        return 0, 0, "no tests ran"
    first = next((error for ok, error in results.values() if not ok), "")
    return passed, total, "ok" if passed == total else first or "failed"


def _semaphore() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _semaphores:
        _semaphores[loop] = asyncio.Semaphore(cpu_cores())  # the cores this process may use, not the node's
    return _semaphores[loop]


def _local_sandbox(reward_args: dict[str, Any]) -> Any:
    from rlvr.sandbox.local import LocalSandbox

    key = (str(reward_args.get("sandbox_mode", "auto")), reward_args.get("python"))
    if key not in _local_sandboxes:
        _local_sandboxes[key] = LocalSandbox(mode=key[0], python=key[1])
    return _local_sandboxes[key]


async def _run_local(job: Job, limits: Limits, reward_args: dict[str, Any]) -> Verdict:
    from rlvr.sandbox.local import pytest_binds

    sandbox = _local_sandbox(reward_args)
    async with queued(_semaphore()):
        if job.judge_files is None:
            run = await sandbox.run(job.files, RUNNER, limits=limits)
            return (*judge_program(job, run, limits), run)
        # Two sandboxes, two pipes: judge -> solution requests, solution -> judge replies.
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        stop = asyncio.Event()
        solution = asyncio.ensure_future(
            sandbox.run(job.files, RUNNER, limits=limits, stdin=req_r, stdout=rep_w, stop=stop)
        )
        try:
            binds = pytest_binds() if job.needs_pytest else []
            judge_run = await sandbox.run(
                job.judge_files,
                JUDGE,
                limits=limits,
                ro_binds=binds,
                stdin=rep_r,
                pass_fds=(req_w,),
                args=(str(req_w),),
                trusted=True,
            )
        finally:
            stop.set()
        solution_run = await solution
        if solution_run.info.get("sandbox_restarted"):  # whichever of the two runs brought the server back
            judge_run.info["sandbox_restarted"] = True
        if solution_run.killed in SANDBOX_FAILURES:  # the solution's sandbox never ran it: not its 0
            return 0, job.total, "sandbox failure", solution_run
        return (*judge_events(job, judge_run, solution_run, limits), judge_run)


async def _run_e2b(job: Job, limits: Limits, reward_args: dict[str, Any]) -> Verdict:
    from rlvr.sandbox.e2b import E2BSandbox

    sandbox = E2BSandbox(template=reward_args.get("e2b_template"))
    if job.judge_files is None:
        run = await sandbox.run(job.files, RUNNER, limits=limits)
        return (*judge_program(job, run, limits), run)
    files = {PAIR: _harness("pair.py")}
    files.update({f"solution/{name}": text for name, text in job.files.items()})
    files.update({f"judge/{name}": text for name, text in job.judge_files.items()})
    run = await sandbox.run(files, PAIR, limits=limits)
    return (*judge_events(job, run, None, limits), run)


async def _rerun_when_lost(
    run: Callable[[Job, Limits, dict[str, Any]], Awaitable[Verdict]],
    job: Job,
    limits: Limits,
    reward_args: dict[str, Any],
) -> tuple[Verdict, int]:
    """The job's verdict and how many times it was re-run (whole: solution and judge) because the
    fork server died under it (see SANDBOX_RERUNS)."""
    verdict = await run(job, limits, reward_args)
    reruns = 0
    while verdict[3].killed == "sandbox_lost" and reruns < SANDBOX_RERUNS:
        reruns += 1
        verdict = await run(job, limits, reward_args)
    return verdict, reruns


def _sandbox_failed(lost: RunResult, reruns: int) -> RewardResult:
    """Failed, with the sandbox's one-line cause: after its re-runs when the fork server died."""
    tries = f" (tried {SANDBOX_RERUNS + 1} times)" if lost.killed == "sandbox_lost" else ""
    cause = f"sandbox could not run the tests: {lost.info.get('cause', lost.killed)}{tries}"
    return failed(cause, error=True, **({"sandbox_reruns": reruns} if reruns else {}))


@register("code_sandbox")
async def score(sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Run the response's program (its fenced Python blocks) against test cases in a sandbox (local bwrap or E2B)."""
    reject_unknown_args("code_sandbox", reward_args)
    backend = reward_args.get("sandbox", "local")
    if backend not in ("local", "e2b"):
        raise ValueError(f"code_sandbox: sandbox must be 'local' or 'e2b', got {backend!r}")
    limits = Limits(
        timeout_s=float(reward_args.get("timeout_s", 10.0)),
        memory_mb=int(reward_args.get("memory_mb", 512)),
        max_procs=int(reward_args.get("max_procs", 32)),
        max_output_bytes=int(reward_args.get("max_output_bytes", 1 << 20)),
        max_scratch_mb=int(reward_args.get("max_scratch_mb", 64)),
    )
    text = model_text(completion)
    try:
        cases = normalise_test_cases(sample.case_type, sample.test_cases)
    except ValueError:
        cases = None  # build_jobs below says why the sample is bad
    program = find_program(
        split_think(text)[0], sample.case_type, cases, truncated=completion.finish_reason == "length"
    )
    code = program.code
    if code is None or not code.strip():
        return zero(program.reason or "no code block found")
    try:
        jobs = build_jobs(sample, code, max_procs=limits.max_procs, max_reply_bytes=limits.max_output_bytes)
    except ValueError as exc:
        return failed(f"bad sample: {exc}", error=True)
    run = _run_e2b if backend == "e2b" else _run_local
    outcomes = await asyncio.gather(*(_rerun_when_lost(run, job, limits, reward_args) for job in jobs))
    verdicts = [verdict for verdict, _ in outcomes]
    reruns = sum(n for _, n in outcomes)
    runs = [v[3] for v in verdicts]
    lost = next((r for r in runs if r.killed in SANDBOX_FAILURES), None)
    if lost is not None:  # the sandbox itself, never the solution (see SANDBOX_FAILURES)
        return _sandbox_failed(lost, reruns)
    passed = sum(v[0] for v in verdicts)
    total = sum(v[1] for v in verdicts)
    failures = [v[2] for v in verdicts if v[0] < v[1] or v[1] == 0]
    info: dict[str, Any] = {"passed": passed, "total": total, "backend": backend, "blocks": list(program.blocks)}
    if reruns:
        info["sandbox_reruns"] = reruns
    if restarts := sum(bool(r.info.get("sandbox_restarted")) for r in runs):
        info["sandbox_restarts"] = restarts  # the fork server had died (idle or under a run) and came back
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
