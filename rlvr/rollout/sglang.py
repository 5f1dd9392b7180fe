"""SGLang as a `RolloutEngine`: an async HTTP client over one or many servers, and their command lines.

The client speaks SGLang's native routes, so it drives real SGLang servers (GPU) and
`rlvr serve` (the embedded engine, any machine) alike. Requests go to the live server
with the fewest outstanding requests; a connection error, timeout or 5xx retries with
exponential backoff on another server. A server that fails a request is probed at
/health: if that fails too, it is marked dead and skipped (re-probed every
`revive_after_s`), so one crashed server slows a step instead of killing the run.

Control calls (pause, resume, weight updates) go to every live server concurrently.

Conformance: the routes, request bodies and semantics follow SGLang `SGLANG_VERSION`
(tested against that wheel's own request types, group construction and bucket code in
tests/conformance). Weight updates over a group run in a session: `/begin_weight_update`,
the buckets (`/update_weights_from_distributed`), `/end_weight_update`; 0.5.23 refuses a
bucket outside one. A request with a seed is sent as n one-sample items with seeds
seed + j (SGLang gives all n samples of one item the same `sampling_seed`, which makes
them identical when it honours seeds). A server the weight sync dropped (`hold`) stays
out of rotation, whatever its /health says, until the sync re-admits it (`admit`).

Command lines: SGLang pins its own torch and CUDA packages, so it runs from its own
Python (`rollout.sglang.python`); rlvr never imports it. The tokenizer stays enabled
(no `--skip-tokenizer-init`): the client sends `input_ids`, but stop strings and the
returned `text` need SGLang's detokenizer, and its cost is negligible next to decoding.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from rlvr.recipe.schema import RolloutConfig
from rlvr.rollout.engine import GenerateRequest, PauseMode, RolloutError, parse_version
from rlvr.types import Completion

log = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"
"""The SGLang release rlvr's client, sync and launch command are conformance-tested against."""


class _RetryableError(Exception):
    """A failure that another server (or a later try) may not have."""


@dataclass(slots=True)
class _Server:
    url: str
    outstanding: int = 0
    alive: bool = True
    dead_since: float = 0.0
    failures: int = 0
    held: bool = False  # dropped by the weight sync: stale weights, never revived by /health


def completions_from_sglang(outputs: dict[str, Any] | list[dict[str, Any]], prompt: list[int]) -> list[Completion]:
    """Convert /generate output(s) to Completions (logprobs from `output_token_logprobs`)."""
    items = outputs if isinstance(outputs, list) else [outputs]
    result = []
    for item in items:
        meta = item.get("meta_info", {})
        token_ids = list(item.get("output_ids") or [])
        entries = meta.get("output_token_logprobs") or []
        logprobs = [float(entry[0]) for entry in entries]
        if entries and len(entries) != len(token_ids):
            raise ValueError(f"{len(entries)} logprobs for {len(token_ids)} output ids")
        finish = meta.get("finish_reason") or {}
        finish_type = finish.get("type", "stop") if isinstance(finish, dict) else str(finish)
        result.append(
            Completion(
                text=item.get("text", ""),
                token_ids=token_ids,
                logprobs=logprobs,
                finish_reason=finish_type,
                prompt_token_ids=list(prompt),
                policy_version=parse_version(meta.get("weight_version")),
            )
        )
    return result


def generate_payload(request: GenerateRequest) -> dict[str, Any]:
    """The /generate body for one request.

    Without a seed: one item with `n` (SGLang samples n completions sharing one prefill).
    With a seed: a batch of n one-sample items with `sampling_seed` seed + j, because SGLang
    gives every sample of one item the same seed (identical samples, zero GRPO advantage,
    under `--enable-deterministic-inference`, the only mode that honours seeds).
    """
    params = request.params.to_sglang()
    seed = params.pop("sampling_seed", None)
    if seed is None or request.n == 1:
        if seed is not None:
            params["sampling_seed"] = seed
        params["n"] = request.n
        payload: dict[str, Any] = {"input_ids": list(request.input_ids), "sampling_params": params}
        if request.rid:
            payload["rid"] = request.rid
    else:
        items = [{**params, "n": 1, "sampling_seed": int(seed) + j} for j in range(request.n)]
        payload = {"input_ids": [list(request.input_ids) for _ in items], "sampling_params": items}
        if request.rid:
            payload["rid"] = [f"{request.rid}-{j}" for j in range(request.n)]
    payload["return_logprob"] = True
    return payload


class SGLangClient:
    """A `RolloutEngine` over SGLang-protocol servers (real SGLang or `rlvr serve`)."""

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
    ):
        if not urls:
            raise ValueError("at least one server URL is needed")
        self.servers = [_Server(url.rstrip("/")) for url in urls]
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.revive_after_s = revive_after_s
        self.ranks_per_server = ranks_per_server
        self._session: aiohttp.ClientSession | None = None
        self._lock = threading.Lock()  # the weight sync holds/admits servers from its own thread

    # -- plumbing ---------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers(), connector=aiohttp.TCPConnector(limit=0, force_close=False)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> SGLangClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _request(
        self, server: _Server, method: str, path: str, *, json: Any = None, timeout_s: float | None = None
    ) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s, sock_connect=self.connect_timeout_s)
        try:
            async with self._get_session().request(method, server.url + path, json=json, timeout=timeout) as resp:
                text = await resp.text()
                if resp.status >= 500:
                    raise _RetryableError(f"{server.url}{path}: HTTP {resp.status}: {text[:300]}")
                if resp.status >= 400:
                    raise RolloutError(f"{server.url}{path}: HTTP {resp.status}: {text[:500]}")
                if not text:
                    return None
                try:
                    return await resp.json(content_type=None)
                except ValueError:
                    return text
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise _RetryableError(f"{server.url}{path}: {type(exc).__name__}: {exc}") from exc

    async def _probe(self, server: _Server) -> bool:
        try:
            await self._request(server, "GET", "/health", timeout_s=min(10.0, self.timeout_s))
            return True
        except (_RetryableError, RolloutError):
            return False

    def _pick(self, exclude: set[str]) -> _Server | None:
        now = time.monotonic()
        with self._lock:
            candidates = [
                s
                for s in self.servers
                if s.url not in exclude and not s.held and (s.alive or now - s.dead_since > self.revive_after_s)
            ]
        if not candidates:
            return None
        least = min(s.outstanding for s in candidates)
        return random.choice([s for s in candidates if s.outstanding == least])

    async def _mark_failed(self, server: _Server, error: Exception) -> None:
        server.failures += 1
        if not await self._probe(server):
            with self._lock:
                if server.alive:
                    log.warning("rollout server %s is dead: %s", server.url, error)
                server.alive = False
                server.dead_since = time.monotonic()

    async def _call_balanced(self, path: str, payload: dict[str, Any]) -> Any:
        """POST to the least-loaded live server, retrying elsewhere with backoff."""
        tried: set[str] = set()
        last_error: Exception | None = None
        for attempt in range(self.max_retries + 1):
            server = self._pick(tried) or self._pick(set())
            if server is None:
                break
            server.outstanding += 1
            try:
                result = await self._request(server, "POST", path, json=payload)
                with self._lock:
                    if not server.alive and not server.held:
                        log.info("rollout server %s is back", server.url)
                        server.alive = True
                return result
            except _RetryableError as exc:
                last_error = exc
                tried.add(server.url)
                await self._mark_failed(server, exc)
            finally:
                server.outstanding -= 1
            await asyncio.sleep(self.backoff_s * (2**attempt))
        raise RolloutError(f"{path} failed on every server after {self.max_retries + 1} tries: {last_error}")

    async def _broadcast(self, path: str, payload: dict[str, Any] | None = None, *, method: str = "POST") -> list[Any]:
        """Call every live server concurrently; any failure raises."""
        live = [s for s in self.servers if s.alive and not s.held]
        if not live:
            raise RolloutError("no live rollout servers")
        results = await asyncio.gather(
            *(self._request(s, method, path, json=payload) for s in live), return_exceptions=True
        )
        errors = [f"{s.url}: {r}" for s, r in zip(live, results, strict=True) if isinstance(r, BaseException)]
        if errors:
            raise RolloutError(f"{path} failed: {'; '.join(errors)}")
        for result in results:
            if isinstance(result, dict) and result.get("success") is False:
                raise RolloutError(f"{path} failed: {result.get('message')}")
        return list(results)

    # -- the Protocol -----------------------------------------------------------------------

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """One /generate per request (its n samples stay on one server to share the prompt's prefill)."""

        async def one(request: GenerateRequest) -> list[Completion]:
            output = await self._call_balanced("/generate", generate_payload(request))
            completions = completions_from_sglang(output, request.input_ids)
            if len(completions) != request.n:
                raise RolloutError(f"asked for {request.n} samples, got {len(completions)}")
            return completions

        groups = await asyncio.gather(*(one(r) for r in requests))
        return [c for group in groups for c in group]

    async def pause(self, mode: PauseMode = "abort") -> None:
        await self._broadcast("/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self._broadcast("/continue_generation", {})

    async def flush_cache(self) -> None:
        await self._broadcast("/flush_cache", None)

    async def update_weights_from_disk(self, path: str, *, version: int | None = None) -> None:
        payload: dict[str, Any] = {"model_path": path, "flush_cache": True}
        if version is not None:
            payload["weight_version"] = str(version)
        await self._broadcast("/update_weights_from_disk", payload)

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int = 1,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> None:
        """Server i joins as ranks rank_offset + i * ranks_per_server (its tp ranks follow)."""
        live = [s for s in self.servers if s.alive]
        payloads = [
            {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": rank_offset + i * self.ranks_per_server,
                "world_size": world_size,
                "group_name": group_name,
                "backend": backend,
            }
            for i in range(len(live))
        ]
        results = await asyncio.gather(
            *(
                self._request(s, "POST", "/init_weights_update_group", json=p)
                for s, p in zip(live, payloads, strict=True)
            ),
            return_exceptions=True,
        )
        for server, result in zip(live, results, strict=True):
            if isinstance(result, BaseException) or (isinstance(result, dict) and not result.get("success", True)):
                raise RolloutError(f"{server.url}: init_weights_update_group failed: {result}")

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str = "weight_update_group",
        version: int | None = None,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> None:
        payload: dict[str, Any] = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "flush_cache": flush_cache,
        }
        if version is not None:
            payload["weight_version"] = str(version)
        if load_format is not None:  # SGLang's UpdateWeightsFromDistributedReqInput.load_format
            payload["load_format"] = load_format
        await self._broadcast("/update_weights_from_distributed", payload)

    async def begin_weight_update(self) -> None:
        """Open a weight-update session (SGLang refuses distributed updates outside one)."""
        await self._broadcast("/begin_weight_update", {})

    async def end_weight_update(self) -> None:
        await self._broadcast("/end_weight_update", {})

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        await self._broadcast("/destroy_weights_update_group", {"group_name": group_name})

    async def server_info(self) -> dict[str, Any]:
        """The first live server's /server_info (SGLang: its resolved launch arguments, e.g. tp_size)."""
        results = await self._broadcast("/server_info", method="GET")
        return results[0] if results and isinstance(results[0], dict) else {}

    async def model_info(self) -> dict[str, Any]:
        results = await self._broadcast("/model_info", method="GET")
        return results[0] if results and isinstance(results[0], dict) else {}

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


# -- command lines ---------------------------------------------------------------------------


def build_sglang_command(
    cfg: RolloutConfig,
    *,
    model_path: str,
    port: int,
    host: str = "0.0.0.0",
    gpu_ids: Sequence[int] | None = None,
    dtype: str | None = None,
    weight_version: str | None = None,
    seed: int | None = None,
    tokenizer_path: str | None = None,
) -> list[str]:
    """argv for one `sglang.launch_server` (run with the SGLang env's own Python).

    `gpu_ids` pins the server to those GPUs through `env CUDA_VISIBLE_DEVICES=...`, so the
    argv is self-contained for subprocess and srun alike.
    """
    sg = cfg.sglang
    argv: list[str] = []
    if gpu_ids is not None:
        argv += ["env", f"CUDA_VISIBLE_DEVICES={','.join(str(g) for g in gpu_ids)}"]
    argv += [
        sg.python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(sg.tp_size),
        "--dp-size",
        str(sg.dp_size),
        "--mem-fraction-static",
        f"{sg.mem_fraction_static:g}",
    ]
    if tokenizer_path:
        argv += ["--tokenizer-path", str(tokenizer_path)]
    if dtype:
        argv += ["--dtype", dtype]
    if sg.api_key:
        argv += ["--api-key", sg.api_key]
    if weight_version is not None:
        argv += ["--weight-version", str(weight_version)]
    if seed is not None:
        argv += ["--random-seed", str(seed)]
    argv += list(sg.extra_args)
    return argv
