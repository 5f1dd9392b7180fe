"""Judge harness (stdlib only; copied into its own sandbox as `_rlvr_judge.py`, run with `python -I -S`).

The test code (assert lines, a HumanEval `check`, a pytest file) runs HERE, in a process the
solution never touches, with pristine builtins. The solution's names are `Remote` proxies that call
into the solution process over a pipe and get plain values back (`wire.py`), so nothing the
solution does can change what the judge sees; a non-plain return stays a `Remote` that can be called
or read but not compared, hashed, iterated or tested for truth (that fails the case).

fd 0: replies from the solution; fd `argv[1]`: requests to it; fd 1: one JSON
event per line to the host ({"case": i, "ok": bool, "error": str} ..., then {"done": true}).
"""

import builtins
import json
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's dir out
import _rlvr_wire as wire  # noqa: E402  # pyright: ignore[reportMissingImports]


class NotPlainValue(TypeError):
    pass


class SolutionError(Exception):
    """An exception raised in the solution whose type is not a builtin one."""


class SolutionGone(Exception):
    pass


class Channel:
    def __init__(self, read_fd, write_fd, cap):
        self.reader = os.fdopen(read_fd, "rb")
        self.write_fd = write_fd
        self.cap = cap

    def receive(self):
        line = self.reader.readline(self.cap + 1)
        if len(line) > self.cap:
            raise SolutionGone(f"the solution sent a reply larger than max_output_bytes ({self.cap})")
        if not line:
            raise SolutionGone("the solution process exited")
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            raise SolutionGone("the solution process sent a malformed reply") from None

    def request(self, message):
        data = wire.dumps(message).encode()
        try:
            while data:
                data = data[os.write(self.write_fd, data) :]
        except OSError:
            raise SolutionGone("the solution process exited") from None
        return self.answer(self.receive())

    def answer(self, reply):
        if not isinstance(reply, dict):
            raise SolutionGone("the solution process sent a malformed reply")
        if "value" in reply:
            try:
                return wire.decode(reply["value"])
            except (wire.NotPlain, RecursionError) as exc:
                raise NotPlainValue(f"the solution returned a malformed value: {exc}") from None
        if "handle" in reply and type(reply["handle"]) is int:
            return Remote(self, reply["handle"], str(reply.get("type", "object"))[:100])
        if reply.get("missing"):
            raise AttributeError(str(reply.get("name", "?"))[:100])
        if "raise" in reply:
            name, message = str(reply["raise"])[:100], str(reply.get("message", ""))[:300]
            kind = getattr(builtins, name, None)
            if isinstance(kind, type) and issubclass(kind, Exception) and kind.__module__ == "builtins":
                raise kind(message)
            raise SolutionError(f"{name}: {message}")
        raise SolutionGone("the solution process sent a malformed reply")

    def get(self, handle, name):
        return self.request({"op": "get", "obj": handle, "name": name})

    def call(self, handle, args, kwargs):
        try:
            payload = {"op": "call", "obj": handle, "args": wire.encode(list(args)), "kwargs": wire.encode(kwargs)}
        except wire.NotPlain as exc:
            raise NotPlainValue(f"an argument cannot be sent to the solution: {exc}") from None
        return self.request(payload)


def _refuse(op):
    def method(self, *args):
        if op in ("__eq__", "__ne__") and args and args[0] is self:
            return op == "__eq__"
        raise NotPlainValue(
            f"the solution returned a {object.__getattribute__(self, '_type')} object, not a plain value ({op})"
        )

    return method


class Remote:
    """A solution object that is not a plain value: it can be called and its attributes read, nothing else."""

    __slots__ = ("_channel", "_id", "_type")

    def __init__(self, channel, handle, kind):
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_id", handle)
        object.__setattr__(self, "_type", kind)

    def __call__(self, *args, **kwargs):
        return self._channel.call(self._id, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._channel.get(self._id, name)

    def __repr__(self):
        return f"<solution {self._type}>"

    __hash__ = object.__hash__


for _op in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__", "__iter__",
            "__contains__", "__getitem__", "__int__", "__float__", "__index__", "__str__", "__format__",
            "__add__", "__sub__", "__mul__", "__truediv__", "__neg__", "__abs__", "__round__"):  # fmt: skip
    setattr(Remote, _op, _refuse(_op))


class SolutionNamespace(dict):
    """Globals for test code: a name the tests define wins, then builtins, then the solution's name."""

    def __init__(self, channel):
        super().__init__(__builtins__=builtins, __name__="__main__")
        self.channel = channel

    def __missing__(self, name):
        if name.startswith("__") or hasattr(builtins, name):
            raise KeyError(name)
        try:
            value = self.channel.get(0, name)
        except AttributeError:
            raise KeyError(name) from None
        self[name] = value
        return value


class RemoteModule(types.ModuleType):
    """`solution` as the pytest file imports it: every public name is the solution's, by proxy."""

    _channel: Channel

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._channel.get(0, name)


def describe(exc):
    return f"{type(exc).__name__}: {exc}"[:300]


def run_assert(spec, channel, emit):
    namespace = SolutionNamespace(channel)
    for i, case in enumerate(spec["cases"]):
        try:
            exec(compile(case, f"<case {i}>", "exec"), namespace)
            emit({"case": i, "ok": True})
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a test is a failure, too
            emit({"case": i, "ok": False, "error": f"case {i}: {describe(exc)}"})
            if isinstance(exc, SolutionGone):
                return


def run_check(spec, channel, emit):
    namespace = SolutionNamespace(channel)
    try:
        if spec.get("prelude"):
            exec(compile(spec["prelude"], "<prelude>", "exec"), namespace)
        candidate = channel.get(0, spec["entry_point"])
        namespace[spec["entry_point"]] = candidate
        exec(compile(spec["test"], "<test>", "exec"), namespace)
        namespace["check"](candidate)
        emit({"case": 0, "ok": True})
    except BaseException as exc:  # noqa: BLE001
        emit({"case": 0, "ok": False, "error": describe(exc)})


def run_pytest(spec, channel, emit):
    if spec.get("pylib"):
        sys.path.insert(0, spec["pylib"])
    sys.dont_write_bytecode = True
    try:
        import pytest
    except ImportError as exc:
        emit({"case": 0, "ok": False, "error": f"pytest is not available in the sandbox: {exc}"})
        return
    module = RemoteModule("solution")
    module._channel = channel
    sys.modules["solution"] = module
    count = [0]

    class Collect:
        def pytest_runtest_logreport(self, report):
            if report.when == "call" and report.passed:
                emit({"case": count[0], "ok": True})
                count[0] += 1
            elif report.failed:
                emit({"case": count[0], "ok": False, "error": f"{report.nodeid}: {report.when} failed"[:300]})
                count[0] += 1

        def pytest_collectreport(self, report):
            if report.failed:
                emit({"case": count[0], "ok": False, "error": f"collection failed: {str(report.longrepr)[-300:]}"})
                count[0] += 1

    pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:pastebin", spec["test_file"]], plugins=[Collect()])


def main():
    with open("_rlvr_spec.json") as f:
        spec = json.load(f)
    events, replies = os.dup(1), os.dup(0)  # private copies: pytest's capture rebinds fds 0 and 1
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the tests' prints go nowhere

    def emit(event):
        os.write(events, (json.dumps(event) + "\n").encode())

    channel = Channel(replies, int(sys.argv[1]), spec["max_reply_bytes"])
    try:
        hello = channel.receive()
    except SolutionGone as exc:
        hello = {"load_error": str(exc)}
    if not isinstance(hello, dict) or not hello.get("ready"):
        error = hello.get("load_error") if isinstance(hello, dict) else None
        emit({"load_error": f"solution failed to load: {str(error or 'malformed hello')[:300]}"})
        return
    {"assert": run_assert, "check": run_check, "pytest": run_pytest}[spec["mode"]](spec, channel, emit)
    emit({"done": True})


if __name__ == "__main__":
    main()
