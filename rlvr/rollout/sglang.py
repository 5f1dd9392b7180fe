"""SGLang as a `RolloutClient`: an async HTTP client over one or many servers, and their command lines.

The client speaks SGLang's native routes, so it drives real SGLang servers (GPU) and `rlvr serve`
(the embedded engine, any machine) alike; balancing, retries and dead servers are
`rlvr.rollout.pool.ServerPool`'s. The routes and semantics follow `SGLANG_VERSION` (tested against
that wheel's own request types and bucket code in tests/conformance): weight updates run in a
begin/end session, and a seeded request goes out as n one-sample items seeded seed + j, since SGLang
gives all samples of one item the same seed. SGLang pins its own torch and CUDA, so it runs from its
own Python (`rollout.sglang.python`) and rlvr never imports it; its tokenizer stays on, since stop
strings and the returned text need its detokenizer (docs/engines.md, SGLang).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from rlvr.recipe.schema import RolloutConfig
from rlvr.rollout.base import GenerateRequest, PauseMode, RolloutError, parse_version
from rlvr.rollout.pool import ServerPool
from rlvr.types import Completion

log = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"
"""The SGLang release rlvr's client, sync and launch command are conformance-tested against."""


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


class SGLangClient(ServerPool):
    """A `RolloutClient` over SGLang-protocol servers (real SGLang or `rlvr serve`)."""

    # -- the Protocol -----------------------------------------------------------------------

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """One /generate per request: its n samples go to one server in one body (n items with
        seeds seed + j when seeded), which prefills the prompt once (`rlvr serve`) or from its
        radix cache (SGLang); requests with one `affinity` key (a group) go to the same server."""

        async def one(request: GenerateRequest) -> list[Completion]:
            output = await self._call_balanced(
                "/generate", generate_payload(request), samples=request.n, affinity=request.affinity
            )
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

    async def release_memory_occupation(self) -> None:
        """rollout.colocate: free the GPU memory (weights and KV cache) for the trainer that shares
        the GPU (SGLang started with `--enable-memory-saver`; `rlvr serve` drops its KV cache)."""
        await self._broadcast("/release_memory_occupation", {})

    async def resume_memory_occupation(self) -> None:
        """Take the memory back before the weights are pushed and generation resumes."""
        await self._broadcast("/resume_memory_occupation", {})

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
        group = {"master_address": master_address, "master_port": master_port, "world_size": world_size}
        group |= {"group_name": group_name, "backend": backend}
        await self._join_group("/init_weights_update_group", group, rank_offset=rank_offset)

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

    async def weights_fingerprint(self, *, adapter: bool = False) -> dict[str, Any]:
        """`rlvr serve`'s per-weight XXH3-128 checksum (four 32-bit words) of what it serves (`rlvr.sync.fingerprint`);
        `adapter`: of the last LoRA adapter it merged."""
        results = await self._broadcast("/weights_fingerprint" + ("?adapter=1" if adapter else ""), method="GET")
        body = results[0] if results and isinstance(results[0], dict) else {}
        return dict(body.get("tensors") or {})

    async def model_info(self) -> dict[str, Any]:
        results = await self._broadcast("/model_info", method="GET")
        return results[0] if results and isinstance(results[0], dict) else {}


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
