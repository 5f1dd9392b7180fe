"""Solution harness (stdlib only; copied into the sandbox as `_rlvr_run.py` and run with `python -I -S`).

Reads `_rlvr_spec.json`, deletes it, applies in-sandbox limits, then either

* `program` (stdin_stdout): runs the solution as `__main__`; the host compares its stdout;
* `serve` (assert, pytest, check_based): loads the solution as module `solution` and answers
  the judge's requests (read a name, call a function) over the pipe on fds 0/1, returning
  plain values by value and anything else as a numbered handle. The verdict is never made
  here: whatever the solution does to this process (patch `json`, walk the stack, register
  atexit hooks) can only change the values it hands back, which is what it is judged on.
"""

import contextlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's dir out
import _rlvr_wire as wire  # noqa: E402  # pyright: ignore[reportMissingImports]


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


def _describe(exc):
    try:
        return type(exc).__name__, str(exc)[:300]
    except BaseException:  # noqa: BLE001 - a solution's __str__ may raise anything
        return "Exception", "unprintable exception"


def _answer(handles, message):
    try:
        obj = handles[message["obj"]]
        if message["op"] == "get":
            try:
                value = getattr(obj, message["name"])
            except AttributeError:
                return {"missing": True, "name": message["name"]}
        else:
            args = wire.decode(message["args"])
            kwargs = wire.decode(message["kwargs"])
            value = obj(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - SystemExit inside a call fails that call only
        name, text = _describe(exc)
        return {"raise": name, "message": text}
    try:
        return {"value": wire.encode(value)}
    except (wire.NotPlain, RecursionError):
        handles.append(value)
        kind = type(value)
        return {"handle": len(handles) - 1, "type": getattr(kind, "__qualname__", "object")}


def _serve():
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives as long as the process

    def send(message):
        try:
            data = wire.dumps(message).encode()
        except (TypeError, ValueError, RecursionError):
            data = wire.dumps({"raise": "TypeError", "message": "reply could not be encoded"}).encode()
        while data:
            data = data[os.write(replies, data) :]

    try:
        module = _load_solution()
    except BaseException as exc:  # noqa: BLE001 - a crashing solution fails every case
        name, text = _describe(exc)
        send({"load_error": f"{name}: {text}"})
        return
    send({"ready": True})
    handles = [module]
    for line in requests:
        send(_answer(handles, json.loads(line)))


def main():
    with open("_rlvr_spec.json") as f:
        spec = json.load(f)
    with contextlib.suppress(OSError):  # bound read-only under bwrap
        os.unlink("_rlvr_spec.json")
    _limit_procs(spec.get("nproc"))
    sys.path.insert(0, os.getcwd())
    if spec["mode"] == "serve":
        _serve()
        return
    if spec.get("stdin_file"):
        fd = os.open(spec["stdin_file"], os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
    import runpy

    sys.argv = ["solution.py"]
    runpy.run_path("solution.py", run_name="__main__")


if __name__ == "__main__":
    main()
