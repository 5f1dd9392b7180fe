"""In-sandbox harness (stdlib only; copied into the sandbox as `_rlvr_run.py` and run with `python -I -S`).

Reads `_rlvr_spec.json`, deletes it, applies in-sandbox limits, then either runs the
solution as a program (stdin_stdout: output is judged by the host) or loads it as module
`solution` and runs the test cases, reporting one line `<nonce><json>` on a private copy of
stdout. The solution's own prints go to /dev/null in the test modes so it cannot interleave
with the verdict line. This protects against accidents, not against a solution that
deliberately tampers with the harness in-process (documented limit).
"""

import contextlib
import json
import os
import sys
import traceback


def _limit_procs(nproc):
    if nproc:
        import resource

        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _load_solution():
    import types

    module = types.ModuleType("solution")
    module.__file__ = os.path.abspath("solution.py")
    sys.modules["solution"] = module
    with open("solution.py") as f:
        code = compile(f.read(), "solution.py", "exec")
    exec(code, module.__dict__)
    return module


def _run_assert(spec, module, report):
    cases = spec["cases"]
    passed, errors = 0, []
    for i, case in enumerate(cases):
        try:
            exec(compile(case, f"<case {i}>", "exec"), module.__dict__)
            passed += 1
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a test is a failure, too
            errors.append(f"case {i}: {type(exc).__name__}: {exc}"[:300])
    report({"passed": passed, "total": len(cases), "errors": errors[:5]})


def _run_check(spec, module, report):
    namespace = dict(module.__dict__)
    try:
        exec(compile(spec["test"], "<test>", "exec"), namespace)
        namespace["check"](getattr(module, spec["entry_point"]))
        report({"passed": 1, "total": 1, "errors": []})
    except BaseException as exc:  # noqa: BLE001
        report({"passed": 0, "total": 1, "errors": [f"{type(exc).__name__}: {exc}"[:300]]})


def _run_pytest(spec, report):
    if spec.get("pylib"):
        sys.path.insert(0, spec["pylib"])
    sys.dont_write_bytecode = True
    try:
        import pytest
    except ImportError as exc:
        report({"passed": 0, "total": 0, "errors": [f"pytest is not available in the sandbox: {exc}"]})
        return
    counts = {"passed": 0, "failed": 0, "errors": []}

    class Collect:
        def pytest_runtest_logreport(self, report):
            if report.when == "call" and report.passed:
                counts["passed"] += 1
            elif report.failed:
                counts["failed"] += 1
                counts["errors"].append(f"{report.nodeid}: {report.when} failed"[:300])

        def pytest_collectreport(self, report):
            if report.failed:
                counts["failed"] += 1
                counts["errors"].append(f"collection failed: {str(report.longrepr)[-300:]}")

    pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:pastebin", "test_solution.py"], plugins=[Collect()])
    total = counts["passed"] + counts["failed"]
    report({"passed": counts["passed"], "total": total, "errors": counts["errors"][:5]})


def main():
    with open("_rlvr_spec.json") as f:
        spec = json.load(f)
    os.unlink("_rlvr_spec.json")
    _limit_procs(spec.get("nproc"))
    sys.path.insert(0, os.getcwd())
    mode = spec["mode"]
    if mode == "program":
        if spec.get("stdin_file"):
            fd = os.open(spec["stdin_file"], os.O_RDONLY)
            os.dup2(fd, 0)
            os.close(fd)
            sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
        import runpy

        sys.argv = ["solution.py"]
        runpy.run_path("solution.py", run_name="__main__")
        return
    nonce = spec["nonce"]
    verdict_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives as long as the process

    def report(result):
        os.write(verdict_fd, ("\n" + nonce + json.dumps(result) + "\n").encode())

    if mode == "pytest":
        _run_pytest(spec, report)
        return
    try:
        module = _load_solution()
    except BaseException as exc:  # noqa: BLE001 - a crashing solution fails every case
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        report({"passed": 0, "total": spec.get("total", 1), "errors": [f"solution failed to load: {tb}"[:300]]})
        return
    if mode == "assert":
        _run_assert(spec, module, report)
    elif mode == "check":
        _run_check(spec, module, report)


if __name__ == "__main__":
    main()
