"""Per-engine HTTP control for a sync: concurrent calls with deadlines, failures named by URL.

Why not call the loop's `SGLangClient` directly: its fan-out raises one error for all
servers and cannot exclude one, while a sync must know *which* engine failed (to drop it
with on_engine_failure = "continue") and must overlap HTTP with the trainer's broadcast
on the calling thread. So each engine gets a one-URL client (same API key, same
ranks_per_server) living on a private event-loop thread: `submit` returns at once,
`collect` waits with a deadline. That also keeps `push` synchronous and independent of
whatever event loop the RL loop runs.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from rlvr.bridge import LoopThread
from rlvr.rundir import StaleGeneration
from rlvr.sync.base import EngineFailure, SyncError

log = logging.getLogger(__name__)

T = TypeVar("T")

Futures = dict[str, "cf.Future[Any]"]
"""One call per engine URL; each answer is the engine client's (JSON, a bool, None)."""
EngineFactory = Callable[[str], object]
"""Builds the one-engine client for a URL: an object with the engine's async control methods."""
PerUrl = Callable[[str], Mapping[str, object]]
"""Per-engine keyword arguments of a call (e.g. each engine's `rank_offset`)."""


def _default_factory(parent: object, timeout_s: float) -> EngineFactory:
    """One-URL clients of the parent's own kind (SGLang's or vLLM's routes), without retries.

    The parent is probed, not typed: the loop's `ServerPool` has `single`, lighter fakes do not."""

    def make(url: str) -> object:
        single = getattr(parent, "single", None)
        if callable(single):
            return single(url, timeout_s=timeout_s)
        from rlvr.rollout.sglang import SGLangClient

        return SGLangClient(
            [url],
            api_key=getattr(parent, "api_key", None),
            timeout_s=timeout_s,
            max_retries=0,
            ranks_per_server=getattr(parent, "ranks_per_server", 1),
        )

    return make


class EngineCalls:
    """Calls to the rollout engines a sync drives: who is live, calls with deadlines, the failure policy.

    `client` is the loop's client (anything with `live_servers`; an `SGLangClient`): its
    live servers are the candidates, minus those this sync already dropped. `factory(url)`
    builds a one-engine client (tests pass fakes). The client's optional abilities (`admit`,
    `hold`, `servers`) are probed: tests hand in fakes with only some of them.
    """

    def __init__(
        self,
        client: object,
        *,
        timeout_s: float,
        on_failure: str = "fail",
        factory: EngineFactory | None = None,
    ):
        if on_failure not in ("fail", "continue"):
            raise ValueError(f"on_engine_failure must be fail or continue, got {on_failure!r}")
        self.client = client
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self.ranks_per_server = int(getattr(client, "ranks_per_server", 1))
        self.dropped: dict[str, EngineFailure] = {}
        self.rejoining: list[str] = []  # dropped engines that answer /health again: synced, then admitted
        self._dropped_instance: dict[str, int | None] = {}  # a dropped engine's instance when dropped
        self._factory = factory or _default_factory(client, timeout_s)
        self._clients: dict[str, object] = {}
        self._loop = LoopThread(name="rlvr-sync-http")

    # -- membership ----------------------------------------------------------------------

    def live(self) -> list[str]:
        """The engines this sync updates: the client's servers in rotation plus those rejoining."""
        listed = getattr(self.client, "live_servers", None)
        urls = list(listed if listed is not None else getattr(self.client, "urls", []))
        live = [u for u in urls if u not in self.dropped]
        return live + [u for u in self.rejoining if u not in live]

    def instance(self, url: str) -> int | None:
        """Which start of the server at `url` the client knows of (None: not known): a restarted
        server is a new engine, with no update group and the base weights."""
        instance_of = getattr(self.client, "instance_of", None)
        return cast("int | None", instance_of(url)) if callable(instance_of) else None

    def _restarted(self, url: str) -> bool:
        return url in self._dropped_instance and self.instance(url) != self._dropped_instance[url]

    def _held(self) -> list[str]:
        """Servers the client holds on its own (seen dead, or restarted) that this sync has not dropped."""
        held = cast("list[str]", getattr(self.client, "held_servers", None) or [])
        return [u for u in held if u not in self.dropped and u not in self.rejoining]

    def recover(self, *, waiting: bool = False) -> None:
        """Engines out of rotation that answer /health again rejoin at this sync: those this sync
        dropped, and those the client held (seen dead, or restarted). They stay held until
        `admit_rejoined` after a sync that gave them the current weights. `waiting` (no engine
        left): only engines that were dead or restarted, never one that answered with an error."""
        refresh = getattr(self.client, "refresh_identity", None)
        if callable(refresh):
            refresh(force=True)
        dropped = [u for u, f in self.dropped.items() if not waiting or f.stage == "health" or self._restarted(u)]
        candidates = dropped + self._held()
        if not candidates:
            return
        for url in sorted(self.healthy(candidates)):
            log.info("weight sync: engine %s answers again; it rejoins the update group", url)
            self.dropped.pop(url, None)
            self._dropped_instance.pop(url, None)
            self.rejoining.append(url)

    def admit_rejoined(self, updated: Sequence[str] | None = None) -> None:
        """The engines that rejoined and got this push (`updated`; None: all of them) have the
        current weights now: back in the client's rotation. Any other stays held."""
        admit = getattr(self.client, "admit", None)
        admitted = [u for u in self.rejoining if updated is None or u in updated]
        for url in admitted:
            if callable(admit):
                admit(url)
                continue
            for server in getattr(self.client, "servers", []) or []:
                if getattr(server, "url", None) == url and hasattr(server, "alive"):
                    server.alive = True
        self.rejoining = [u for u in self.rejoining if u not in admitted]

    def one(self, url: str) -> object:
        """The one-engine client for `url` (built once)."""
        if url not in self._clients:
            self._clients[url] = self._factory(url)
        return self._clients[url]

    # -- calls ---------------------------------------------------------------------------

    def submit(
        self, urls: Sequence[str], method: str, *args: object, per_url: PerUrl | None = None, **kw: object
    ) -> Futures:
        """Start `method(*args, **kw)` on every engine now; `per_url(url)` adds per-engine kwargs."""
        return self._start(urls, method, args, kw, per_url)

    def _start(
        self, urls: Sequence[str], method: str, args: Sequence[object], kw: Mapping[str, object], per_url: PerUrl | None
    ) -> Futures:
        futures: Futures = {}
        for url in urls:
            extra: Mapping[str, object] = per_url(url) if per_url else {}
            futures[url] = self._loop.submit(getattr(self.one(url), method)(*args, **kw, **extra))
        return futures

    def collect(self, futures: Futures, stage: str, *, timeout_s: float | None = None) -> list[EngineFailure]:
        """Wait for every call (one shared deadline); returns the failures. Raises only StaleGeneration:
        an engine that has seen a newer trainer refused this one's call."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        failures: list[EngineFailure] = []
        for url, future in futures.items():
            try:
                refused = _refusal(future.result(timeout=max(0.0, deadline - time.monotonic())))
                if refused is not None:
                    failures.append(EngineFailure(url, stage, refused))
            except cf.TimeoutError:
                future.cancel()
                failures.append(EngineFailure(url, stage, f"no answer within {self.timeout_s:g}s"))
            except StaleGeneration:  # a newer trainer owns the engines: this one stops, no engine is at fault
                raise
            except BaseException as exc:  # noqa: BLE001 - any engine error is reported, not raised here
                failures.append(EngineFailure(url, stage, f"{type(exc).__name__}: {exc}"))
        return failures

    def call(self, urls: Sequence[str], stage: str, method: str, *args: object, **kw: object) -> list[EngineFailure]:
        return self.collect(self._start(urls, method, args, kw, None), stage)

    def results(self, urls: Sequence[str], method: str, **kw: object) -> dict[str, object]:
        """`method(**kw)` on every engine that has it; the answers (an exception for a failed call)."""
        has = [u for u in urls if hasattr(self.one(u), method)]
        futures = {u: self._loop.submit(getattr(self.one(u), method)(**kw)) for u in has}
        answers: dict[str, object] = {}
        deadline = time.monotonic() + self.timeout_s
        for url, future in futures.items():
            try:
                answers[url] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except BaseException as exc:  # noqa: BLE001 - reported to the caller
                future.cancel()
                answers[url] = exc
        return answers

    def unhealthy(self, urls: Sequence[str]) -> list[EngineFailure]:
        """The health check before every push: an engine that died while idle is named here,
        before any group or session is built around it."""
        ok = self.healthy(urls)
        return [EngineFailure(url, "health", "does not answer /health") for url in urls if url not in ok]

    def healthy(self, urls: Sequence[str]) -> set[str]:
        """The engines that answer /health within min(10 s, timeout)."""
        futures = self.submit(urls, "health")
        ok: set[str] = set()
        for url, future in futures.items():
            try:
                if future.result(timeout=min(10.0, self.timeout_s)):
                    ok.add(url)
            except BaseException:  # noqa: BLE001
                future.cancel()
        return ok

    # -- policy --------------------------------------------------------------------------

    def handle(self, failures: Sequence[EngineFailure], *, version: int) -> None:
        """Raise (fail mode) or drop the failed engines (continue mode; raises if none is left)."""
        if not failures:
            return
        detail = "; ".join(str(f) for f in failures)
        if self.on_failure == "fail":
            for failure in failures:  # held before the raise: never resumed on part of the weights
                self._mark_dead(failure.url)
            raise SyncError(f"weight sync to version {version} failed: {detail}", failures)
        for failure in failures:
            if failure.url not in self.dropped:
                log.warning("weight sync: dropping engine %s", failure)
                self.dropped[failure.url] = failure
                self._dropped_instance[failure.url] = self.instance(failure.url)
                if failure.url in self.rejoining:
                    self.rejoining.remove(failure.url)
                self._mark_dead(failure.url)
        if not self.live() and not self.await_rejoin():
            raise SyncError(f"weight sync to version {version}: no engine left ({detail})", failures)

    def await_rejoin(self, *, poll_s: float = 2.0) -> bool:
        """Continue mode with no engine left: wait up to `timeout_s` for a dead one to answer again
        (the launcher restarts dead servers, and a restarted one rejoins this sync). Engines that
        answered with an error are not waited for. False if none comes back."""
        dead = [u for u, f in self.dropped.items() if f.stage == "health" or self._restarted(u)]
        others = [u for u in [*self.dropped, *self._held()] if u not in dead]
        answering: set[str] = self.healthy(others) if others else set()  # one concurrent probe round
        dead += [u for u in others if u not in answering]
        if not dead:
            return False
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            self.recover(waiting=True)
            if self.live():
                return True
            time.sleep(poll_s)
        return False

    def _mark_dead(self, url: str) -> None:
        """Tell the loop's client to stop routing generations to `url` (it has stale weights).

        `hold(url)` (SGLangClient, thread-safe) keeps it out of rotation whatever its /health
        says, until `admit_rejoined`; other clients by duck typing (`mark_dead`, or the
        `alive` flag of its server record).
        """
        for name in ("hold", "mark_dead"):
            mark = getattr(self.client, name, None)
            if callable(mark):
                mark(url)
                return
        for server in getattr(self.client, "servers", []) or []:
            if getattr(server, "url", None) == url and hasattr(server, "alive"):
                server.alive = False
                if hasattr(server, "dead_since"):
                    server.dead_since = time.monotonic()

    def close(self) -> None:
        for client in self._clients.values():
            close = getattr(client, "close", None)
            if close is not None:
                with contextlib.suppress(BaseException):  # closing is best effort
                    self._loop.submit(close()).result(timeout=5)
        self._clients.clear()
        self._loop.stop()
        self._loop.close()


def _refusal(answer: object) -> str | None:
    """The message of an answer that reports `success: false` (SGLang's JSON), else None."""
    if not isinstance(answer, dict):
        return None
    body = cast("dict[str, object]", answer)  # JSON from the engine's HTTP answer
    return str(body.get("message")) if body.get("success") is False else None
