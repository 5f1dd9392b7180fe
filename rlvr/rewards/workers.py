"""A small process pool whose stuck workers are killed and replaced.

Why not `concurrent.futures.ProcessPoolExecutor`: it cannot cancel a running call, and a
worker stuck in sympy (math-verify can hang on adversarial LaTeX) would hold its slot
forever. math-verify's own timeout uses `signal.alarm`, which only works in a main thread;
each worker here runs jobs in its own main thread (so that timeout works too), and the
parent enforces a hard deadline on top: past it, the worker is SIGKILLed and a fresh one
spawned. Jobs are `"module:function"` strings plus picklable arguments, so the pool carries
no closures and workers import only what the job needs.

The pool is loop-agnostic (blocking waits run in its own threads), so one pool serves any
number of asyncio event loops, e.g. one per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import signal
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlvr.plugins import load_plugin
from rlvr.process import die_with_parent
from rlvr.recipe.machine import cpu_cores
from rlvr.rewards.deadline import queued

POOL_REWARDS = frozenset({"math_rule", "verifiers"})
"""The rewards that send work to the shared worker processes (code_sandbox runs its own sandbox
processes under its own bound; llm_judge is HTTP; plug-ins run on the event loop)."""


def reward_workers(reward_names: Iterable[str], *, trainer_ranks_on_node: int, cpus: int | None = None) -> int:
    """How many reward worker processes trainer rank 0 starts (0 when no domain's reward uses them).

    Rank 0's node also runs its trainer ranks, each of which keeps a core busy feeding its GPU (the
    Python thread launching kernels, plus its data-loading and NCCL threads); a sympy worker
    spinning beside them slows every training step, which costs more than a slower verdict. So:
    the cores this process may use (`rlvr.recipe.machine.cpu_cores`), minus one per trainer rank on the node and one
    for rank 0's rollout manager (its event loop, tokenizer thread and the sandboxes' supervision),
    half of what is left (verification comes in bursts as groups finish; the other half stays free
    for code_sandbox's processes and the OS), at least 1 and at most 32. Only rewards in
    `POOL_REWARDS` use the pool: a recipe without them starts none.
    """
    if not POOL_REWARDS.intersection(reward_names):
        return 0
    free = (cpus if cpus is not None else cpu_cores()) - max(trainer_ranks_on_node, 1) - 1
    return min(32, max(1, free // 2))


@dataclass(slots=True)
class JobResult:
    """What a pool call ended as: ok (with value), error (worker raised), timeout or crash."""

    status: str
    value: Any = None
    error: str = ""
    seconds: float = 0.0


@dataclass(slots=True)
class PoolStats:
    calls: int = 0
    timeouts: int = 0
    crashes: int = 0
    restarts: int = 0
    errors: int = 0
    extra: dict[str, int] = field(default_factory=dict)


def _worker_main(conn: Any, preload: Sequence[str]) -> None:
    die_with_parent(signal.SIGKILL)  # a crashed controller leaves no sympy worker spinning
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    cache: dict[str, Any] = {}

    def resolve(target: str) -> Any:
        if target not in cache:
            cache[target] = load_plugin(target, kind="reward worker job", form="module:function")
        return cache[target]

    for target in preload:
        with contextlib.suppress(Exception):  # a failed warm-up shows up as job errors later
            resolve(target)()
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        target, args, kwargs = job
        try:
            conn.send(("ok", resolve(target)(*args, **kwargs)))
        except Exception as exc:  # noqa: BLE001 - reported to the caller, the worker lives on
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:500]))


class _Worker:
    def __init__(self, ctx: Any, preload: Sequence[str]):
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, tuple(preload)), daemon=True)
        self.process.start()
        child.close()
        self.ready = False

    def wait_ready(self, timeout_s: float) -> bool:
        try:
            if not self.ready and self.conn.poll(timeout_s):
                self.ready = self.conn.recv()[0] == "ready"
        except (EOFError, OSError):  # died while starting (e.g. the spawn could not import __main__)
            return False
        return self.ready

    def kill(self) -> None:
        if self.process.is_alive() and self.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(timeout=5)
        self.conn.close()


class WorkerPool:
    """`max_workers` spawned processes; `await pool.call("mod:fn", *args, timeout_s=...)`."""

    def __init__(self, *, max_workers: int | None = None, preload: Sequence[str] = (), start_timeout_s: float = 120.0):
        self.max_workers = max(1, max_workers or cpu_cores())
        self._ctx = multiprocessing.get_context("spawn")
        self._preload = tuple(preload)
        self._start_timeout_s = start_timeout_s
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(self.max_workers, thread_name_prefix="rlvr-reward-worker")
        self._closed = False
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self.stats = PoolStats()
        for _ in range(self.max_workers):
            self._spawn()

    def _spawn(self) -> None:
        worker = _Worker(self._ctx, self._preload)
        with self._lock:
            self._all.add(worker)
        self._idle.put(worker)

    def _retire(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.kill()
        if not self._closed:
            self.stats.restarts += 1
            self._spawn()

    async def call(self, target: str, *args: Any, timeout_s: float, **kwargs: Any) -> JobResult:
        """Run `target(*args, **kwargs)` in a worker; never raises for job failures or timeouts."""
        if self._closed:
            raise RuntimeError("WorkerPool is closed")
        loop = asyncio.get_running_loop()
        if loop not in self._slots:
            self._slots[loop] = asyncio.Semaphore(self.max_workers)
        async with queued(self._slots[loop]):  # the wait for a free worker is not the reward's own time
            return await loop.run_in_executor(self._threads, self._call_blocking, target, args, kwargs, timeout_s)

    def call_sync(self, target: str, *args: Any, timeout_s: float, **kwargs: Any) -> JobResult:
        return self._call_blocking(target, args, kwargs, timeout_s)

    def _call_blocking(self, target: str, args: tuple, kwargs: dict, timeout_s: float) -> JobResult:
        while True:  # a bounded wait, so that close() never leaves a thread blocked forever
            if self._closed:
                return JobResult("crash", error="pool closed")
            try:
                worker = self._idle.get(timeout=0.5)
                break
            except queue.Empty:
                continue
        self.stats.calls += 1
        if not worker.wait_ready(self._start_timeout_s):
            self.stats.crashes += 1
            self._retire(worker)
            return JobResult("crash", error="worker did not start")
        start = time.perf_counter()
        try:
            worker.conn.send((target, args, kwargs))
            if not worker.conn.poll(timeout_s):
                self.stats.timeouts += 1
                self._retire(worker)
                return JobResult("timeout", seconds=time.perf_counter() - start)
            status, value = worker.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as exc:  # killed by OOM, segfault in a C extension...
            self.stats.crashes += 1
            self._retire(worker)
            return JobResult("crash", error=f"worker died: {type(exc).__name__}", seconds=time.perf_counter() - start)
        self._idle.put(worker)
        seconds = time.perf_counter() - start
        if status == "ok":
            return JobResult("ok", value=value, seconds=seconds)
        self.stats.errors += 1
        return JobResult("error", error=str(value), seconds=seconds)

    def close(self) -> None:
        """Stop every worker (politely, then SIGKILL) and the helper threads."""
        self._closed = True
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for worker in workers:
            with contextlib.suppress(OSError, BrokenPipeError):
                worker.conn.send(None)
        for worker in workers:
            worker.process.join(timeout=1)
            worker.kill()
        self._threads.shutdown(wait=False, cancel_futures=True)


_SHARED: dict[str, WorkerPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(name: str, *, max_workers: int | None = None, preload: Sequence[str] = ()) -> WorkerPool:
    """The process-wide pool called `name` (e.g. "math"), created on first use.

    Passing a different `max_workers` than the live pool's replaces it (the RewardPool does
    this from its `max_workers`), so a process never holds two pools for one job kind.
    """
    with _SHARED_LOCK:
        pool = _SHARED.get(name)
        if pool is not None and (pool._closed or (max_workers and pool.max_workers != max_workers)):
            pool.close()
            pool = None
        if pool is None:
            pool = _SHARED[name] = WorkerPool(max_workers=max_workers, preload=preload)
        return pool


def close_shared_pools() -> None:
    with _SHARED_LOCK:
        for pool in _SHARED.values():
            pool.close()
        _SHARED.clear()
