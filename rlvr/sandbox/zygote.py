"""Fork server inside one long-lived bwrap sandbox (stdlib only; run as root with `python -I -S -B`).

Starting an interpreter and a bwrap per run costs more than the run, so this process starts once,
warm, inside a sandbox with no network and a read-only root, and forks each run into fresh
namespaces, where the run's pid 1 sets up its scratch, limits and uid before running the harness.

Protocol on the SOCK_SEQPACKET socket whose fd is argv[1]: the host sends a JSON request with the
run's stdin/stdout/stderr (+ extra) fds attached (SCM_RIGHTS); we answer {"id", "exit"} when it
ends; {"kill": id} kills it now. Exit code 125 (`SETUP_FAILED`) means the run's namespace could not
be set up, before any of its code ran; only the relay process knows that (pid 1 tells it on a pipe
closed before anything untrusted runs), so a run that exits 125 itself is reported as 1.
"""

import array
import atexit
import contextlib  # noqa: F401 - preloaded for the harnesses: a forked run imports nothing twice
import ctypes
import fcntl
import json
import os
import resource
import runpy
import selectors
import signal
import socket
import sys
import traceback
import types

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000,
    0x4000000,
    0x8000000,
    0x20000000,
    0x40000000,
)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SANDBOX = "/sandbox"
SETUP_FAILED = 125
READY_FD_MIN = 100  # above the few fds a run gets (0, 1, 2, passed pipes)


def _check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(source, target, fstype, flags, data=None):
    _check(libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                      data.encode() if data else None), f"mount {target}")  # fmt: skip


def _setup(request, fds, ready):
    """In the run's pid 1: scratch, files, limits, fds, uid. Any failure ends the run (exit 125);
    success is one byte on `ready`, closed before the harness runs."""
    uid, limits = request["uid"], request["limits"]
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    size = limits["max_scratch_mb"] * 1024 * 1024
    _mount("tmpfs", SANDBOX, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0755,uid={uid},gid={uid}")
    spool = os.path.join("/spool", request["spool"])
    for name in os.listdir(spool):
        with open(os.path.join(spool, name), "rb") as src, open(os.path.join(SANDBOX, name), "wb") as dst:
            dst.write(src.read())
        os.chown(os.path.join(SANDBOX, name), uid, uid)
    os.mkdir(os.path.join(SANDBOX, ".tmp"))
    os.chown(os.path.join(SANDBOX, ".tmp"), uid, uid)
    os.chdir(SANDBOX)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    os.closerange(len(fds), ready)
    os.closerange(ready + 1, 1 << 16)
    mb = 1024 * 1024
    for kind, value in ((resource.RLIMIT_AS, limits["memory_mb"] * mb), (resource.RLIMIT_CPU, limits["cpu_s"]),
                        (resource.RLIMIT_FSIZE, limits["max_file_mb"] * mb), (resource.RLIMIT_NOFILE, 256),
                        (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, limits["max_procs"] + 1)):  # fmt: skip
        resource.setrlimit(kind, (value, value))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # from root to an unmapped uid: every capability is gone
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # after setuid, which clears it
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": SANDBOX, "LANG": "C.UTF-8"})
    os.write(ready, b"1")
    os.close(ready)


def _run(request, fds, ready):
    """The run's pid 1: set up, then run the harness as __main__ in this warm interpreter."""
    try:
        _setup(request, fds, ready)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(SETUP_FAILED)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = [request["script"], *request["args"]]
    code = 0
    try:
        for name, compiled in request.get("_modules", {}).items():  # the harness's own helpers, compiled once
            module = types.ModuleType(name)
            module.__file__ = os.path.join(SANDBOX, name + ".py")
            sys.modules[name] = module
            exec(compiled, module.__dict__)
        if "_code" in request:
            exec(request["_code"], {"__name__": "__main__", "__file__": os.path.join(SANDBOX, request["script"]),
                                    "__builtins__": __builtins__})  # fmt: skip
        else:
            runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


_compiled = {}


def _compiled_file(path):
    """Compile a harness file once per distinct content (they are the same few files every run)."""
    with open(path, "rb") as f:
        source = f.read()
    if source not in _compiled:
        if len(_compiled) > 64:
            _compiled.clear()
        _compiled[source] = compile(source, os.path.basename(path), "exec")
    return _compiled[source]


def _precompile(request):
    """Trusted harness files named by the host (`precompile`) are compiled here, before the fork."""
    spool = os.path.join("/spool", request["spool"])
    names = request.get("precompile", [])
    try:
        if request["script"] in names:
            request["_code"] = _compiled_file(os.path.join(spool, request["script"]))
        request["_modules"] = {n[:-3]: _compiled_file(os.path.join(spool, n)) for n in names if n != request["script"]}
    except (OSError, SyntaxError, ValueError):
        request.pop("_code", None)
        request.pop("_modules", None)


def _spawn(request, fds):
    """Fork C; C unshares the namespaces and forks the run's pid 1, then relays its status."""
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # The judge (dataset test code) may share this sandbox's network namespace (loopback only,
        # no route out); model code always gets its own.
        net = 0 if request.get("share_net") else CLONE_NEWNET
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | net), "unshare")
        ready_r, pipe_w = os.pipe()
        ready_w = fcntl.fcntl(pipe_w, fcntl.F_DUPFD, READY_FD_MIN)
        os.close(pipe_w)
        child = os.fork()
        if child == 0:
            os.close(ready_r)
            _run(request, fds, ready_w)
        os.close(ready_w)
        for fd in fds:
            os.close(fd)
        # The zygote's kill reaches us as SIGTERM: SIGKILL the run's pid 1 and with it its namespace.
        signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
        set_up = _read_ready(ready_r)
        _, status = os.waitpid(child, 0)
        if not set_up:
            os._exit(SETUP_FAILED)
        code = os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        os._exit(1 if code == SETUP_FAILED else code)  # the run's own 125 is not the sandbox's
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(SETUP_FAILED)


def _read_ready(fd):
    """True once the run's pid 1 finished its set-up; False if it exited (or was killed) first."""
    while True:
        try:
            data = os.read(fd, 1)
            break
        except InterruptedError:
            continue
    os.close(fd)
    return data == b"1"


def main():
    runpy.run_path(__file__, run_name="_rlvr_warm")  # runpy's lazy imports happen once, here
    control = socket.socket(fileno=int(sys.argv[1]))
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    running = {}  # pidfd -> (run id, pid)
    by_id = {}
    while True:
        for key, _ in selector.select():
            if key.fileobj is control:
                fds = array.array("i")
                data, ancdata, _, _ = control.recvmsg(1 << 16, socket.CMSG_SPACE(16 * fds.itemsize))
                if not data:
                    return
                for level, kind, payload in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                request = json.loads(data)
                if "kill" in request:
                    if request["kill"] in by_id:
                        os.kill(by_id[request["kill"]], signal.SIGTERM)
                    continue
                _precompile(request)
                pid = _spawn(request, list(fds))
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                running[pidfd] = (request["id"], pid)
                by_id[request["id"]] = pid
                selector.register(pidfd, selectors.EVENT_READ)
            else:
                pidfd = key.fd
                run_id, pid = running.pop(pidfd)
                by_id.pop(run_id, None)
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
                control.send(json.dumps({"id": run_id, "exit": code}).encode())


if __name__ == "__main__":
    main()
