"""The HTTP plumbing every server-backed `RolloutClient` shares: balancing, retries, dead servers.

Groups, not samples, are spread: a request's affinity key (one per GRPO group) pins it to one
server, so a group's n-sample request and every continuation share that server's prefix cache; a
new key goes to the live server with the fewest outstanding samples. Failed requests retry with
backoff on another server (the group moves with them), a server that also fails /health is skipped
until it answers again, and one the weight sync dropped (`hold`) stays out until `admit`: a
crashed server slows a step instead of killing the run. Under a weight sync that re-admits them
(`hold_dead`), a server seen dead, or restarted (its `instance` in the run directory moved on), is
held too: it serves again only after a full push, never on the weights it booted with; and a group
with no live server waits up to `wait_s` for one instead of failing its step. At most `max_inflight_per_server` samples
go to a server at once, over a pool of that many connections; control calls have their own session,
so a pause never queues behind generation. `SGLangClient` and `VLLMClient` add the routes.
docs/engines.md ("Groups, not samples") has the details and the measurement.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import aiohttp

from rlvr.rollout.base import RolloutError
from rlvr.rundir import GENERATION_HEADER, STALE_STATUS, StaleGeneration

log = logging.getLogger(__name__)

# Replies longer than this are decoded on a worker thread: a group of long samples is megabytes of
# token ids and logprobs, and parsing it on the manager's event loop would hold every other episode,
# reward and weight-push call behind it.
OFF_LOOP_JSON_CHARS = 64 * 1024

IDENTITY_POLL_S = 1.0
"""How often `pick` re-reads the servers' instances: a restart is seen within a second."""

WAIT_POLL_S = 1.0
"""How often a group waiting for a live server looks again (`wait_s`)."""

AFFINITY_KEYS = 65536
"""Affinity keys remembered per client: far more than the groups in flight at once (waves of
`prompts_per_step` groups plus an evaluation), a few MB at most."""


def _raise_if_stale(where: str, text: str) -> None:
    """A 409 that says the trainer is stale raises StaleGeneration with the server's line."""
    try:
        body = jsonlib.loads(text)
    except ValueError:
        return
    if isinstance(body, dict) and body.get("stale_generation"):
        raise StaleGeneration(f"{where}: {body.get('message')}")


def _reraise_stale(results: Sequence[object]) -> None:
    """A stale refusal from any server of a fan-out stops the trainer; it is no server's failure."""
    for result in results:
        if isinstance(result, StaleGeneration):
            raise result


class _RetryableError(Exception):
    """A failure that another server (or a later try) may not have."""


class _Slots:
    """A FIFO semaphore counting samples: a request for n samples takes n slots (at most
    `capacity`: a request bigger than the bound runs alone). FIFO, so a big request is not
    starved by a stream of small ones. Used on one event loop (the rollout manager's)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, count: int) -> int:
        """Wait for `count` slots (capped at capacity); returns how many to `release`."""
        count = max(1, min(count, self.capacity))
        if not self._waiters and self.used + count <= self.capacity:
            self.used += count
            return count
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((count, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # granted, then cancelled before it ran
                self.release(count)
            else:
                self._wake()  # it may have been the head blocking smaller requests behind it
            raise
        return count

    def release(self, count: int) -> None:
        self.used -= count
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            count, future = self._waiters[0]
            if future.done():  # cancelled while waiting
                self._waiters.popleft()
                continue
            if self.used + count > self.capacity:
                return
            self._waiters.popleft()
            self.used += count
            future.set_result(None)


@dataclass(slots=True)
class _Server:
    url: str
    outstanding: int = 0  # samples sent to this server (or waiting for its slots) and not answered
    alive: bool = True
    dead_since: float = 0.0
    failures: int = 0
    held: bool = False  # dropped by the weight sync: stale weights, never revived by /health
    slots: _Slots | None = None  # None: unbounded
    instance: int | None = None  # which start of the process at `url` this is (None: not known yet)


class ServerPool:
    """Servers behind one client: who is live, group-affine balanced POSTs with retries and a
    bound on samples in flight per server, fan-out control calls (see the module docstring).

    `max_inflight_per_server`: samples sent at once per server (None: unbounded; `make_client`
    derives the recipe's default, `rollout.max_inflight_per_server`). `hold_dead`, `wait_s` and
    `instances` (url -> start count, read from the run directory) are for a run whose weight sync
    re-admits servers (`sync.on_engine_failure = "continue"`): see the module docstring."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        revive_after_s: float = 30.0,
        ranks_per_server: int = 1,
        max_inflight_per_server: int | None = None,
        hold_dead: bool = False,
        wait_s: float = 0.0,
        instances: Callable[[], Mapping[str, int]] | None = None,
        generation: int | None = None,
    ):
        if not urls:
            raise ValueError("at least one server URL is needed")
        if max_inflight_per_server is not None and max_inflight_per_server < 1:
            raise ValueError(f"max_inflight_per_server must be at least 1, got {max_inflight_per_server}")
        self.max_inflight_per_server = max_inflight_per_server
        self.servers = [
            _Server(url.rstrip("/"), slots=_Slots(max_inflight_per_server) if max_inflight_per_server else None)
            for url in urls
        ]
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.revive_after_s = revive_after_s
        self.ranks_per_server = ranks_per_server
        self.hold_dead = hold_dead
        self.wait_s = wait_s
        self._instances = instances
        self.generation = generation  # the trainer start's, sent with every call: `rlvr serve` fences on it
        self._identity_at = 0.0
        self._session: aiohttp.ClientSession | None = None  # control calls and probes
        self._generation: aiohttp.ClientSession | None = None  # /generate: a bounded pool per server
        self._affinity: OrderedDict[str, str] = OrderedDict()  # affinity key -> server url, LRU order
        self._lock = threading.Lock()  # the weight sync holds/admits servers from its own thread

    # -- plumbing ---------------------------------------------------------------------------

    def single(self, url: str, *, timeout_s: float) -> Self:
        """A client of the same kind for one of the servers, without retries (the weight sync's)."""
        return type(self)(
            [url], api_key=self.api_key, timeout_s=timeout_s, max_retries=0, ranks_per_server=self.ranks_per_server,
            generation=self.generation,
        )  # fmt: skip

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if self.generation is not None:
            headers[GENERATION_HEADER] = str(self.generation)
        return headers

    def _get_session(self) -> aiohttp.ClientSession:
        """Control calls and /health probes: few at a time, never behind generation's pool."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers(), connector=aiohttp.TCPConnector(limit=0, force_close=False)
            )
        return self._session

    def generation_session(self) -> aiohttp.ClientSession:
        """Generation requests: at most `max_inflight_per_server` connections per server (the slots
        already bound the requests, so none waits for a connection; kept alive across requests)."""
        if self._generation is None or self._generation.closed:
            cap = self.max_inflight_per_server or 0  # 0: aiohttp's "no limit"
            connector = aiohttp.TCPConnector(limit=cap * len(self.servers), limit_per_host=cap, force_close=False)
            self._generation = aiohttp.ClientSession(headers=self._headers(), connector=connector)
        return self._generation

    async def close(self) -> None:
        for session in (self._session, self._generation):
            if session is not None:
                await session.close()
        self._session = self._generation = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self,
        server: _Server,
        method: str,
        path: str,
        *,
        json: Any = None,
        timeout_s: float | None = None,
        generation: bool = False,
    ) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s, sock_connect=self.connect_timeout_s)
        session = self.generation_session() if generation else self._get_session()
        try:
            async with session.request(method, server.url + path, json=json, timeout=timeout) as resp:
                text = await resp.text()
                if resp.status >= 500:
                    raise _RetryableError(f"{server.url}{path}: HTTP {resp.status}: {text[:300]}")
                if resp.status == STALE_STATUS:
                    _raise_if_stale(f"{server.url}{path}", text)
                if resp.status >= 400:
                    raise RolloutError(f"{server.url}{path}: HTTP {resp.status}: {text[:500]}")
                if not text:
                    return None
                try:
                    if len(text) > OFF_LOOP_JSON_CHARS:  # a group's ids and logprobs: ms of parsing
                        return await asyncio.to_thread(jsonlib.loads, text)
                    return jsonlib.loads(text)
                except ValueError:
                    return text
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise _RetryableError(f"{server.url}{path}: {type(exc).__name__}: {exc}") from exc

    async def _probe(self, server: _Server) -> bool:
        try:
            await self.request(server, "GET", "/health", timeout_s=min(10.0, self.timeout_s))
            return True
        except (_RetryableError, RolloutError):
            return False

    def pick(self, exclude: set[str], *, affinity: str | None = None) -> _Server | None:
        """The server for a request: its group's server while that one is live and not excluded,
        else the candidate with the fewest outstanding samples (and the group moves there)."""
        now = time.monotonic()
        self.refresh_identity(now=now)
        with self._lock:
            candidates = [
                s
                for s in self.servers
                if s.url not in exclude and not s.held and (s.alive or now - s.dead_since > self.revive_after_s)
            ]
            if not candidates:
                return None
            if affinity is not None and (url := self._affinity.get(affinity)) is not None:
                pinned = next((s for s in candidates if s.url == url and s.alive), None)
                if pinned is not None:
                    self._affinity.move_to_end(affinity)
                    return pinned
            least = min(s.outstanding for s in candidates)
            server = random.choice([s for s in candidates if s.outstanding == least])
            if affinity is not None:
                self._affinity[affinity] = server.url
                self._affinity.move_to_end(affinity)
                while len(self._affinity) > AFFINITY_KEYS:
                    self._affinity.popitem(last=False)
            return server

    def refresh_identity(self, *, now: float | None = None, force: bool = False) -> None:
        """Hold each server whose process was restarted since it was last seen (`instances`): it
        booted with the base weights. Reads the run directory at most once per `IDENTITY_POLL_S`."""
        now = time.monotonic() if now is None else now
        if self._instances is None or (not force and now - self._identity_at < IDENTITY_POLL_S):
            return
        self._identity_at = now
        current = self._instances()
        with self._lock:
            for server in self.servers:
                instance = current.get(server.url)
                if instance is None:
                    continue
                if server.instance is not None and instance != server.instance and self.hold_dead:
                    log.warning("rollout server %s was restarted: held until a full weight push", server.url)
                    server.held, server.alive, server.dead_since = True, False, now
                server.instance = instance

    def instance_of(self, url: str) -> int | None:
        """The start count of the process at `url` as last read (None: not known); `refresh_identity`
        reads again (the weight sync does, once per push)."""
        return next((s.instance for s in self.servers if s.url == url.rstrip("/")), None)

    async def _mark_failed(self, server: _Server, error: Exception) -> None:
        server.failures += 1
        if not await self._probe(server):
            with self._lock:
                if server.alive:
                    log.warning("rollout server %s is dead: %s", server.url, error)
                server.alive = False
                server.dead_since = time.monotonic()
                if self.hold_dead:  # whatever comes back at this URL has lost its weights
                    server.held = True

    async def _call_balanced(
        self, path: str, payload: dict[str, Any], *, samples: int = 1, affinity: str | None = None
    ) -> Any:
        """POST `samples` samples' request to its group's server (`affinity`), else the least-loaded
        live one, once that server has free slots; retry elsewhere with backoff (the group follows).
        With no server to take it, or its retries spent, it waits up to `wait_s` for a live one."""
        tried: set[str] = set()
        last_error: Exception | None = None
        failures = 0
        trouble_since: float | None = None  # the first failure, or the first time no server could take it
        while True:
            server = self.pick(tried, affinity=affinity) or self.pick(set(), affinity=affinity)
            if server is None:
                trouble_since = trouble_since or time.monotonic()
                if time.monotonic() - trouble_since >= self.wait_s:
                    break
                await asyncio.sleep(WAIT_POLL_S)
                continue
            server.outstanding += samples
            try:
                taken = await server.slots.acquire(samples) if server.slots is not None else 0
                try:
                    result = await self.request(server, "POST", path, json=payload, generation=True)
                finally:
                    if server.slots is not None and taken:
                        server.slots.release(taken)
                with self._lock:
                    if not server.alive and not server.held:
                        log.info("rollout server %s is back", server.url)
                        server.alive = True
                return result
            except _RetryableError as exc:
                last_error = exc
                failures += 1
                trouble_since = trouble_since or time.monotonic()
                tried.add(server.url)
                await self._mark_failed(server, exc)
            finally:
                server.outstanding -= samples
            if failures > self.max_retries and time.monotonic() - (trouble_since or 0.0) >= self.wait_s:
                break
            await asyncio.sleep(min(self.backoff_s * (2 ** (failures - 1)), WAIT_POLL_S * 2))
        waited = f" and {self.wait_s:g} s of waiting for a live server" if self.wait_s else ""
        tries = f"{failures} {'try' if failures == 1 else 'tries'}"
        raise RolloutError(f"{path} failed on every server after {tries}{waited}: {last_error}")

    async def _broadcast(self, path: str, payload: dict[str, Any] | None = None, *, method: str = "POST") -> list[Any]:
        """Call every live server concurrently; any failure raises."""
        live = [s for s in self.servers if s.alive and not s.held]
        if not live:
            raise RolloutError("no live rollout servers")
        results = await asyncio.gather(
            *(self.request(s, method, path, json=payload) for s in live), return_exceptions=True
        )
        _reraise_stale(results)
        errors = [f"{s.url}: {r}" for s, r in zip(live, results, strict=True) if isinstance(r, BaseException)]
        if errors:
            raise RolloutError(f"{path} failed: {'; '.join(errors)}")
        for result in results:
            if isinstance(result, dict) and result.get("success") is False:
                raise RolloutError(f"{path} failed: {result.get('message')}")
        return list(results)

    async def _join_group(self, path: str, group: dict[str, Any], *, rank_offset: int, wrap: str | None = None) -> None:
        """Ask every live server to join the update group: server i's first rank is
        rank_offset + i * ranks_per_server (its tp ranks follow). `wrap` nests the fields
        under that key (vLLM's `init_info`)."""
        live = [s for s in self.servers if s.alive]
        bodies = [{**group, "rank_offset": rank_offset + i * self.ranks_per_server} for i in range(len(live))]
        results = await asyncio.gather(
            *(
                self.request(s, "POST", path, json={wrap: body} if wrap else body)
                for s, body in zip(live, bodies, strict=True)
            ),
            return_exceptions=True,
        )
        _reraise_stale(results)
        for server, result in zip(live, results, strict=True):
            if isinstance(result, BaseException) or (isinstance(result, dict) and not result.get("success", True)):
                raise RolloutError(f"{server.url}: {path.lstrip('/')} failed: {result}")

    def hold(self, url: str) -> None:
        """Keep `url` out of rotation (its weights are stale) until `admit(url)`; thread-safe."""
        with self._lock:
            for server in self.servers:
                if server.url == url.rstrip("/"):
                    server.held = True
                    server.alive = False
                    server.dead_since = time.monotonic()

    def admit(self, url: str) -> None:
        """Put a held server back in rotation (it has the current weights); thread-safe."""
        with self._lock:
            for server in self.servers:
                if server.url == url.rstrip("/"):
                    server.held = False
                    server.alive = True

    async def stranded(self) -> bool:
        """No server in rotation while one that is held answers /health: generation can only go on
        after a push gives it the current weights (one server, restarted under a waiting step)."""
        self.refresh_identity(force=True)
        held = [s for s in self.servers if s.held]
        if not self.hold_dead or self.live_servers or not held:
            return False
        return any(await asyncio.gather(*(self._probe(s) for s in held)))

    @property
    def held_servers(self) -> list[str]:
        return [s.url for s in self.servers if s.held]

    async def health(self) -> bool:
        """True when at least one server answers /health (and refreshes every server's state)."""
        results = await asyncio.gather(*(self._probe(s) for s in self.servers))
        now = time.monotonic()
        with self._lock:
            for server, ok in zip(self.servers, results, strict=True):
                if not ok and server.alive:
                    server.dead_since = now
                server.alive = ok and not server.held
        return any(results)

    async def wait_ready(self, *, timeout_s: float = 300.0, interval_s: float = 0.5) -> None:
        """Wait until every server answers /health (a server still loading its model refuses connections)."""
        deadline = time.monotonic() + timeout_s
        pending = list(self.servers)
        while pending:
            results = await asyncio.gather(*(self._probe(s) for s in pending))
            pending = [s for s, ok in zip(pending, results, strict=True) if not ok]
            if pending and time.monotonic() > deadline:
                raise RolloutError(f"servers not ready after {timeout_s:.0f}s: {[s.url for s in pending]}")
            if pending:
                await asyncio.sleep(interval_s)
        with self._lock:
            for server in self.servers:
                server.alive = not server.held

    @property
    def live_servers(self) -> list[str]:
        """Servers in rotation: answering, and not held by the weight sync."""
        return [s.url for s in self.servers if s.alive and not s.held]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]
