"""The embedded engine behind SGLang's native HTTP routes, plus an OpenAI chat route.

Why SGLang's own protocol: the RL loop's HTTP client (`rlvr.rollout.sglang.SGLangClient`) then
drives this server and real SGLang servers alike, so CI exercises the exact client code that runs
against GPUs. It is a strict twin of SGLang 0.5.23 (field names, weight-update sessions, the update
group, seed semantics): a test that passes here should mean something for SGLang, so it refuses
what SGLang would drop, every unknown or bad field a 400 naming it. It adds OpenAI's
`/v1/chat/completions` and `/v1/completions` (for a judge) and rlvr's own `/merge_lora_adapter`.
With an API key every route but /health* needs a bearer token; if the engine's worker thread dies
the process exits with status 3. A stale trainer's calls that change what it serves get a
409 (`rlvr.server.fence`, the rule vLLM's servers apply too). The routes and what each
refuses: docs/engines.md (`rlvr serve`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from dataclasses import replace
from typing import Any

from aiohttp import web

from rlvr.data.chat import encode_prompt
from rlvr.rollout.base import EMBEDDED_ENGINE, GenerateRequest, SamplingParams
from rlvr.rundir import GENERATION_HEADER
from rlvr.server.fence import GenerationFence

log = logging.getLogger(__name__)

ENGINE_KEY: web.AppKey[Any] = web.AppKey("engine", object)
INFO_KEY: web.AppKey[dict[str, Any]] = web.AppKey("info", dict)
# Cleared by /pause_generation: as in SGLang's tokenizer manager, a request that arrives while
# generation is paused waits *before* the engine, so it is neither aborted nor counted as
# running (a /flush_cache between pause and continue succeeds, which weight updates rely on).
UNPAUSED_KEY: web.AppKey[asyncio.Event] = web.AppKey("unpaused", asyncio.Event)
FENCE_KEY: web.AppKey[GenerationFence] = web.AppKey("fence", GenerationFence)


def create_app(engine: Any, *, api_key: str | None = None, served_model_name: str | None = None) -> web.Application:
    """An aiohttp app serving `engine` (an `EmbeddedEngine`)."""
    middlewares = [_auth_middleware(api_key)] if api_key else []
    app = web.Application(middlewares=[*middlewares, _fence], client_max_size=1024**3)
    app[ENGINE_KEY] = engine
    app[FENCE_KEY] = GenerationFence()
    app[INFO_KEY] = {"served_model_name": served_model_name or engine.model_path}
    app[UNPAUSED_KEY] = asyncio.Event()
    app[UNPAUSED_KEY].set()
    routes = [
        ("POST", "/generate", generate),
        ("PUT", "/generate", generate),
        ("GET", "/health", health),
        ("GET", "/health_generate", health_generate),
        ("GET", "/get_model_info", model_info),
        ("GET", "/model_info", model_info),
        ("GET", "/get_server_info", server_info),
        ("GET", "/server_info", server_info),
        ("GET", "/get_weight_version", weight_version),
        ("GET", "/weights_fingerprint", weights_fingerprint),
        ("POST", "/flush_cache", flush_cache),
        ("GET", "/flush_cache", flush_cache),
        ("POST", "/init_weights_update_group", init_weights_update_group),
        ("POST", "/destroy_weights_update_group", destroy_weights_update_group),
        ("POST", "/begin_weight_update", begin_weight_update),
        ("POST", "/end_weight_update", end_weight_update),
        ("POST", "/update_weights_from_distributed", update_weights_from_distributed),
        ("POST", "/update_weights_from_disk", update_weights_from_disk),
        ("POST", "/merge_lora_adapter", merge_lora_adapter),
        ("POST", "/pause_generation", pause_generation),
        ("POST", "/continue_generation", continue_generation),
        ("POST", "/release_memory_occupation", release_memory_occupation),
        ("POST", "/resume_memory_occupation", resume_memory_occupation),
        ("GET", "/v1/models", openai_models),
        ("POST", "/v1/chat/completions", openai_chat),
        ("POST", "/v1/completions", openai_completions),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    return app


def _auth_middleware(api_key: str) -> Any:
    expected = f"Bearer {api_key}"

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "OPTIONS" or request.path.startswith("/health"):
            return await handler(request)
        if request.headers.get("Authorization", "") != expected:
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


@web.middleware
async def _fence(request: web.Request, handler: Any) -> web.StreamResponse:
    """Remember the newest trainer generation any call carried; refuse an older one's pushes."""
    fence = request.app[FENCE_KEY]
    verdict = fence.check(request.headers.get(GENERATION_HEADER), method=request.method, path=request.path)
    if verdict is None:
        return await handler(request)
    status, body = verdict
    return web.json_response(body, status=status)


class FieldError(ValueError):
    """A request field SGLang would refuse (or silently drop): answered with 400."""


# The request fields of SGLang 0.5.23 (`sglang/srt/managers/io_struct.py`; `GenerateRequest`
# and `SamplingParams` of `sglang/api/v1/api_types.py` for /generate) this server accepts.
ROUTE_FIELDS = {
    "/generate": {"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "rid", "stream",
                  "top_logprobs_num", "return_text_in_logprobs"},
    "/update_weights_from_disk": {"model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
                                  "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step",
                                  "flush_cache", "rid"},
    "/update_weights_from_distributed": {"names", "dtypes", "shapes", "group_name", "flush_cache",
                                         "abort_all_requests", "weight_version", "load_format", "selector",
                                         "torch_empty_cache", "rid"},
    "/merge_lora_adapter": {"lora_path", "weight_version", "rid"},
    "/init_weights_update_group": {"master_address", "master_port", "rank_offset", "world_size", "group_name",
                                   "backend", "rid"},
    "/destroy_weights_update_group": {"group_name", "rid"},
    "/begin_weight_update": {"selector", "rid"},
    "/end_weight_update": {"rid"},
    "/pause_generation": {"mode", "rid"},
    "/continue_generation": {"torch_empty_cache", "rid"},
}  # fmt: skip
SAMPLING_FIELDS = {
    "max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p", "n", "ignore_eos",
    "skip_special_tokens", "sampling_seed", "min_new_tokens", "no_stop_trim", "spaces_between_special_tokens",
}  # fmt: skip


def _check_fields(route: str, body: dict[str, Any]) -> None:
    allowed = ROUTE_FIELDS.get(route)
    if allowed is None:
        return
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise FieldError(f"unknown field {unknown[0]!r} for {route}")


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except json.JSONDecodeError as exc:
        message = json.dumps({"error": f"invalid JSON: {exc}"})
        raise web.HTTPBadRequest(text=message, content_type="application/json") from exc
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text=json.dumps({"error": "expected a JSON object"}), content_type="application/json")
    try:
        _check_fields(request.path, body)
    except FieldError as exc:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": {"message": str(exc)}}), content_type="application/json"
        ) from exc
    return body


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


# -- /generate ------------------------------------------------------------------------------


def _per_item(value: Any, count: int, batched: bool, default: Any) -> list[Any]:
    """SGLang lets most fields be one value or one per batch item."""
    if value is None:
        return [default] * count
    if batched and isinstance(value, list):
        if len(value) != count:
            raise ValueError(f"expected {count} values, got {len(value)}")
        return value
    return [value] * count


def _parse_generate(body: dict[str, Any], tokenizer: Any) -> tuple[list[GenerateRequest], list[bool], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is None and input_ids is None:
        text = body.get("prompt")
    if (text is None) == (input_ids is None):
        raise ValueError("give exactly one of text or input_ids")
    if body.get("stream"):
        raise ValueError("stream is not supported by the embedded server")
    if text is not None:
        batched = isinstance(text, list)
        prompts = [tokenizer.encode(t) for t in (text if batched else [text])]
    else:
        assert input_ids is not None
        if not isinstance(input_ids, list) or not input_ids:
            raise FieldError("input_ids: expected a non-empty list of token ids (or of lists)")
        batched = isinstance(input_ids[0], list)
        prompts = input_ids if batched else [input_ids]
        for ids in prompts:
            if not isinstance(ids, list) or not ids:
                raise FieldError("input_ids: every prompt must be a non-empty list of token ids")
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise FieldError("input_ids: token ids must be integers")
    count = len(prompts)
    params_list = _per_item(body.get("sampling_params"), count, batched, {})
    return_logprob = _per_item(body.get("return_logprob"), count, batched, False)
    rids = _per_item(body.get("rid"), count, batched, None)
    requests = []
    logprob_flags = []
    for prompt, params, want_lp, rid in zip(prompts, params_list, return_logprob, rids, strict=True):
        parsed, n = _sampling(params)
        if parsed.seed is not None and n > 1:
            # SGLang seeds every sample of one item alike: n identical samples (see the module docstring)
            requests.extend(GenerateRequest(prompt, parsed, n=1, rid=rid) for _ in range(n))
        else:
            requests.append(GenerateRequest(prompt, parsed, n=n, rid=rid))
        logprob_flags.extend([bool(want_lp)] * n)
    many = batched or any((p or {}).get("n", 1) != 1 for p in params_list)
    return requests, logprob_flags, many


def _number(
    params: dict[str, Any], name: str, default: float, ok: Any, rule: str, *, prefix: str = "sampling_params."
) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
        raise FieldError(f"{prefix}{name}: {rule}, got {value!r}")
    return value


def _sampling(params: Any) -> tuple[SamplingParams, int]:
    """Validate one item's `sampling_params` (400 naming the field) and parse it."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise FieldError(f"sampling_params: expected an object, got {type(params).__name__}")
    unknown = sorted(set(params) - SAMPLING_FIELDS)
    if unknown:
        raise FieldError(f"sampling_params: unknown field {unknown[0]!r}")
    n = _number(params, "n", 1, lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1")
    _number(params, "max_new_tokens", 128, lambda v: isinstance(v, int) and v >= 0, "must be an integer >= 0")
    _number(params, "temperature", 1.0, lambda v: v >= 0, "must be >= 0")
    _number(params, "top_p", 1.0, lambda v: 0 < v <= 1, "must be in (0, 1]")
    _number(params, "top_k", -1, lambda v: isinstance(v, int) and (v == -1 or v >= 1), "must be -1 or >= 1")
    _number(params, "min_p", 0.0, lambda v: 0 <= v <= 1, "must be in [0, 1]")
    seed = params.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FieldError(f"sampling_params.sampling_seed: must be an integer, got {seed!r}")
    ids = params.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise FieldError("sampling_params.stop_token_ids: must be a list of integers")
    return SamplingParams.from_sglang(params), int(n)


def _sglang_output(seq: Any, *, rid: str, want_logprob: bool, latency: float) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": seq["finish"],
        "prompt_tokens": len(seq["completion"].prompt_token_ids),
        "completion_tokens": len(seq["completion"].token_ids),
        "cached_tokens": 0,
        "weight_version": seq["version"],
        "e2e_latency": latency,
    }
    completion = seq["completion"]
    if want_logprob:
        meta["output_token_logprobs"] = [
            [lp, tok, None] for lp, tok in zip(completion.logprobs, completion.token_ids, strict=True)
        ]
        meta["input_token_logprobs"] = []
    return {"text": completion.text, "output_ids": list(completion.token_ids), "meta_info": meta}


async def _run(engine: Any, requests: list[GenerateRequest]) -> list[dict[str, Any]]:
    """Generate and keep SGLang's finish_reason dicts (the Completion only has the type)."""
    results = await engine.generate_detailed(requests)
    return results


async def generate(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await _body(request)
        requests, logprob_flags, many = _parse_generate(body, engine.tokenizer)
    except (ValueError, TypeError) as exc:
        return _error(str(exc))
    if not engine.worker_alive:
        return _error("the engine's worker is dead", status=503)
    start = time.monotonic()
    await request.app[UNPAUSED_KEY].wait()
    try:
        results = await _run(engine, requests)
    except ValueError as exc:
        return _error(str(exc))
    latency = time.monotonic() - start
    outputs = []
    index = 0
    for req in requests:
        base = req.rid or uuid.uuid4().hex
        for j in range(req.n):
            rid = base if req.n == 1 else f"{base}-{j}"
            outputs.append(_sglang_output(results[index], rid=rid, want_logprob=logprob_flags[index], latency=latency))
            index += 1
    return web.json_response(outputs if many or len(outputs) > 1 else outputs[0])


# -- health and info ------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    ok = await request.app[ENGINE_KEY].health()
    return web.Response(status=200 if ok else 503)


async def health_generate(request: web.Request) -> web.Response:
    """One greedy token end to end, as SGLang's /health_generate (waits if generation is paused)."""
    engine = request.app[ENGINE_KEY]
    if not await engine.health():
        return web.Response(status=503)
    prompt = engine.tokenizer.encode("hi") or [0]
    try:
        await asyncio.wait_for(
            engine.generate([GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=1))]), timeout=20
        )
    except TimeoutError:
        return web.Response(status=503)
    return web.Response(status=200)


async def model_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {
            "model_path": engine.model_path,
            "tokenizer_path": engine.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": engine.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": getattr(engine.model.config, "model_type", None),
            "architectures": getattr(engine.model.config, "architectures", None),
        }
    )


async def server_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {
            "model_path": engine.model_path,
            "engine": EMBEDDED_ENGINE,
            "backend": type(engine.backend).__name__,
            "device": engine.device,
            "max_batch": engine.max_batch,
            "max_total_num_tokens": engine.max_len * engine.max_batch,
            "context_length": engine.max_len,
            "weight_version": engine.weight_version,
            "tp_size": 1,
            "dp_size": 1,
            "dtype": str(next(engine.model.parameters()).dtype).removeprefix("torch."),
            "paused": engine.paused,
            "running": engine.num_running(),
        }
    )


async def weight_version(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": request.app[ENGINE_KEY].weight_version})


async def weights_fingerprint(request: web.Request) -> web.Response:
    """rlvr's own route: per served weight, its XXH3-128 checksum as four 32-bit words (`rlvr.sync.fingerprint`), which
    the trainer compares with what it pushed; `?adapter=1`: the last merged LoRA adapter's tensors."""
    adapter = request.query.get("adapter", "") in ("1", "true")
    try:
        tensors = await request.app[ENGINE_KEY].weights_fingerprint(adapter=adapter)
    except Exception as exc:  # noqa: BLE001 - report to the caller as the weight routes do
        return web.json_response({"success": False, "message": f"{type(exc).__name__}: {exc}"}, status=400)
    return web.json_response({"success": True, "tensors": tensors})


async def flush_cache(request: web.Request) -> web.Response:
    """No prefix cache exists (every prefill is fresh), but the answer follows SGLang: 400 while
    requests run or wait, so a caller that forgets to pause first fails here too."""
    if request.app[ENGINE_KEY].num_running():
        return web.Response(text="Flush cache failed: requests are running or waiting.\n", status=400)
    return web.Response(text="Cache flushed.\n", status=200)


# -- weights ---------------------------------------------------------------------------------


async def update_weights_from_disk(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    path = body.get("model_path")
    if not path:
        return web.json_response({"success": False, "message": "model_path is required"}, status=400)
    paused = 0
    if body.get("abort_all_requests"):
        paused = await engine.pause("abort")
        await engine.resume()
    version = body.get("weight_version")
    try:
        await engine.update_weights_from_disk(path, version=None if version is None else str(version))
    except Exception as exc:  # noqa: BLE001 - report to the caller as SGLang does
        return web.json_response({"success": False, "message": f"{type(exc).__name__}: {exc}"}, status=400)
    return web.json_response(
        {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": paused}
    )


async def merge_lora_adapter(request: web.Request) -> web.Response:
    """rlvr's adapter push: the base plus this adapter, and its version; a bad folder is a 400
    with one line, and the engine keeps its weights and version."""
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    path = body.get("lora_path")
    if not path or not isinstance(path, str):
        return web.json_response({"success": False, "message": "lora_path is required"}, status=400)
    version = body.get("weight_version")
    try:
        await engine.load_lora_adapter(path, version=None if version is None else str(version))
    except Exception as exc:  # noqa: BLE001 - report to the caller as the other weight routes do
        return web.json_response({"success": False, "message": f"{type(exc).__name__}: {exc}"}, status=400)
    return web.json_response({"success": True, "message": "Succeeded to merge the LoRA adapter."})


async def init_weights_update_group(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    try:
        await engine.init_weights_update_group(
            master_address=str(body["master_address"]),
            master_port=int(body["master_port"]),
            rank_offset=int(body["rank_offset"]),
            world_size=int(body["world_size"]),
            group_name=str(body.get("group_name", "weight_update_group")),
            backend=str(body.get("backend", "gloo" if engine.device == "cpu" else "nccl")),
        )
    except Exception as exc:  # noqa: BLE001
        return web.json_response({"success": False, "message": f"{type(exc).__name__}: {exc}"}, status=400)
    return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})


def _result(ok: bool, message: str) -> web.Response:
    return web.json_response({"success": ok, "message": message}, status=200 if ok else 400)


async def begin_weight_update(request: web.Request) -> web.Response:
    await _body(request)
    try:
        await request.app[ENGINE_KEY].begin_weight_update()
    except RuntimeError as exc:
        return _result(False, str(exc))
    return _result(True, "Success")


async def end_weight_update(request: web.Request) -> web.Response:
    await _body(request)
    try:
        await request.app[ENGINE_KEY].end_weight_update()
    except RuntimeError as exc:
        return _result(False, str(exc))
    return _result(True, "Success")


async def destroy_weights_update_group(request: web.Request) -> web.Response:
    body = await _body(request)
    try:
        await request.app[ENGINE_KEY].destroy_weights_update_group(str(body.get("group_name", "weight_update_group")))
    except KeyError as exc:
        return _result(False, str(exc.args[0]))
    return _result(True, "Succeeded to destroy custom process group.")


async def update_weights_from_distributed(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    if body.get("abort_all_requests"):
        await engine.pause("abort")
        await engine.resume()
    version = body.get("weight_version")
    try:
        await engine.update_weights_from_distributed(
            list(body["names"]),
            list(body["dtypes"]),
            [list(s) for s in body["shapes"]],
            group_name=str(body.get("group_name", "weight_update_group")),
            version=None if version is None else str(version),
            load_format=body.get("load_format"),
            flush_cache=bool(body.get("flush_cache", True)),
        )
    except Exception as exc:  # noqa: BLE001
        return web.json_response({"success": False, "message": f"{type(exc).__name__}: {exc}"}, status=400)
    return web.json_response({"success": True, "message": "Succeeded to update parameter online."})


async def pause_generation(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    mode = body.get("mode", "abort")
    if mode not in ("abort", "retract", "in_place"):
        return _error(f"Invalid mode: {mode!r}. Expected one of ['abort', 'retract', 'in_place'].")
    request.app[UNPAUSED_KEY].clear()
    await engine.pause(mode)
    return web.json_response({"message": "Generation paused successfully."})


async def continue_generation(request: web.Request) -> web.Response:
    await request.app[ENGINE_KEY].resume()
    request.app[UNPAUSED_KEY].set()
    return web.json_response({"message": "Generation continued successfully."})


async def release_memory_occupation(request: web.Request) -> web.Response:
    """rollout.colocate (SGLang's route): abort, stay paused and free the KV cache for the trainer."""
    await _body(request)  # SGLang's optional `tags`: the embedded engine frees its KV cache, whatever they say
    request.app[UNPAUSED_KEY].clear()
    await request.app[ENGINE_KEY].release_kv_cache()
    return web.json_response({"success": True, "message": "Memory released."})


async def resume_memory_occupation(request: web.Request) -> web.Response:
    """The KV cache back, and generation continues (as SGLang after its resume)."""
    await _body(request)
    await request.app[ENGINE_KEY].resume_kv_cache()
    request.app[UNPAUSED_KEY].set()
    return web.json_response({"success": True, "message": "Memory resumed."})


# -- OpenAI ----------------------------------------------------------------------------------


async def openai_models(request: web.Request) -> web.Response:
    name = request.app[INFO_KEY]["served_model_name"]
    return web.json_response(
        {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "rlvr"}]}
    )


def _chat_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The ids rollout gives the same messages: the model's template, else rlvr's plain one led by
    the tokenizer's own BOS (a base model such as Gemma writes garbage without it)."""
    return encode_prompt(messages, tokenizer=tokenizer)


def _openai_params(body: dict[str, Any], *, default_max: int | None) -> tuple[SamplingParams, int]:
    """OpenAI sampling fields, checked once per request as /generate checks SGLang's (400 naming
    the field), and `n`. `max_new_tokens` holds the asked limit (0: none); `_fit` makes it
    each prompt's."""
    temperature = _number(body, "temperature", 1.0, lambda v: v >= 0, "must be >= 0", prefix="")
    top_p = _number(body, "top_p", 1.0, lambda v: 0 < v <= 1, "must be in (0, 1]", prefix="")
    top_k = _number(body, "top_k", -1, lambda v: isinstance(v, int) and (v == -1 or v >= 1), "must be -1 or >= 1", prefix="")  # fmt: skip
    n = _number(body, "n", 1, lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1", prefix="")
    wanted = body.get("max_completion_tokens", body.get("max_tokens"))
    if wanted is not None:
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        _number(body, name, 1, lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1", prefix="")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FieldError(f"seed: must be an integer, got {seed!r}")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
        raise FieldError("stop: must be a string or a list of strings")
    limit = wanted if wanted is not None else default_max
    params = SamplingParams(
        temperature=float(temperature), top_p=float(top_p), top_k=int(top_k), max_new_tokens=int(limit or 0),
        stop=list(stop), seed=seed,
    )  # fmt: skip
    return params, int(n)


def _fit(params: SamplingParams, *, prompt_len: int, max_len: int) -> SamplingParams:
    """`params` for one prompt: the asked limit, or all the room the context has left."""
    room = max(1, max_len - prompt_len - 1)
    limit = min(params.max_new_tokens, room) if params.max_new_tokens else room
    return replace(params, max_new_tokens=limit, stop=list(params.stop))


def _finish(completion: Any) -> str:
    return "length" if completion.finish_reason == "length" else "stop"


def _chat_logprobs(tokenizer: Any, completion: Any) -> dict[str, Any]:
    """OpenAI chat `logprobs.content`: each sampled token with its log-probability."""
    content = []
    for token_id, logprob in zip(completion.token_ids, completion.logprobs, strict=True):
        token = tokenizer.decode([token_id])
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []})
    return {"content": content}


def _completion_logprobs(tokenizer: Any, completion: Any) -> dict[str, Any]:
    """Legacy completions `logprobs` (with `logprobs = 0`: the sampled tokens only)."""
    tokens = [tokenizer.decode([t]) for t in completion.token_ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": list(completion.logprobs), "top_logprobs": None, "text_offset": offsets}


def _unsupported(body: dict[str, Any], route: str) -> str | None:
    """Fields the embedded server cannot honour: refused by name rather than silently ignored."""
    if route == "chat":
        top = body.get("top_logprobs")
        if top not in (None, 0):
            return "top_logprobs: only 0 is supported (logprobs = true returns each sampled token's logprob)"
        if body.get("tools") or body.get("response_format"):
            return f"{'tools' if body.get('tools') else 'response_format'}: not supported by rlvr serve"
        return None
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0, False):
        return "logprobs: only 0 is supported (the sampled tokens' logprobs; no top-N alternatives)"
    if body.get("echo"):
        return "echo: not supported by rlvr serve"
    if body.get("suffix"):
        return "suffix: not supported by rlvr serve"
    return None


async def _openai_generate(
    request: web.Request, prompts: list[list[int]], body: dict[str, Any], *, default_max: int | None
) -> list[Any]:
    """Sample `n` completions per prompt; a FieldError/ValueError is the caller's 400."""
    engine = request.app[ENGINE_KEY]
    params, n = _openai_params(body, default_max=default_max)
    requests = [
        GenerateRequest(prompt, _fit(params, prompt_len=len(prompt), max_len=engine.max_len), n=n) for prompt in prompts
    ]
    await request.app[UNPAUSED_KEY].wait()
    return [result["completion"] for result in await _run(engine, requests)]


async def _sse(request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
    """A `stream = true` answer: the chunks as server-sent events, then `[DONE]`. Each choice
    arrives whole in one chunk (the engine returns finished sequences), which every OpenAI
    client reads as a stream."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def openai_chat(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _error("messages must be a non-empty list")
    if problem := _unsupported(body, "chat"):
        return _error(problem)
    try:
        prompt = _chat_prompt(engine.tokenizer, messages)
    except Exception as exc:  # noqa: BLE001 - a template error is the caller's input
        return _error(f"chat template failed: {exc}")
    try:
        completions = await _openai_generate(request, [prompt], body, default_max=None)
    except ValueError as exc:
        return _error(str(exc))
    want_logprobs = bool(body.get("logprobs"))
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time())}
    head["model"] = body.get("model") or request.app[INFO_KEY]["served_model_name"]
    choices = []
    for i, completion in enumerate(completions):
        logprobs = _chat_logprobs(engine.tokenizer, completion) if want_logprobs else None
        message = {"role": "assistant", "content": completion.text}
        choices.append({"index": i, "message": message, "finish_reason": _finish(completion), "logprobs": logprobs})
    usage = _usage(len(prompt), sum(len(c.token_ids) for c in completions))
    if body.get("stream"):
        chunks = [
            {**head, "object": "chat.completion.chunk", "choices": [
                {"index": c["index"], "delta": c["message"], "finish_reason": c["finish_reason"], "logprobs": c["logprobs"]}
            ]}
            for c in choices
        ]  # fmt: skip
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        return await _sse(request, chunks)
    return web.json_response({**head, "object": "chat.completion", "choices": choices, "usage": usage})


def _completion_prompts(tokenizer: Any, prompt: Any) -> list[list[int]]:
    """OpenAI's `prompt`: a string, a list of strings, a list of token ids, or a list of those."""
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [tokenizer.encode(p) for p in prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [list(prompt)]
    nested = isinstance(prompt, list) and prompt and all(isinstance(p, list) and p for p in prompt)
    if nested and all(isinstance(t, int) and not isinstance(t, bool) for p in prompt for t in p):
        return [list(p) for p in prompt]
    raise FieldError("prompt: expected a string, a list of strings, or token ids (a list or a list of lists)")


async def openai_completions(request: web.Request) -> web.StreamResponse:
    """OpenAI's legacy `/v1/completions`: raw text in, text out (no chat template)."""
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    if problem := _unsupported(body, "completions"):
        return _error(problem)
    try:
        prompts = _completion_prompts(engine.tokenizer, body.get("prompt"))
        completions = await _openai_generate(request, prompts, body, default_max=16)  # OpenAI's default
    except ValueError as exc:
        return _error(str(exc))
    want_logprobs = body.get("logprobs") is not None and body.get("logprobs") is not False
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time())}
    head["model"] = body.get("model") or request.app[INFO_KEY]["served_model_name"]
    choices = [
        {
            "index": i,
            "text": completion.text,
            "finish_reason": _finish(completion),
            "logprobs": _completion_logprobs(engine.tokenizer, completion) if want_logprobs else None,
        }
        for i, completion in enumerate(completions)
    ]
    usage = _usage(sum(map(len, prompts)), sum(len(c.token_ids) for c in completions))
    if body.get("stream"):
        return await _sse(request, [{**head, "object": "text_completion", "choices": [c]} for c in choices])
    return web.json_response({**head, "object": "text_completion", "choices": choices, "usage": usage})


def bind(host: str, port: int):
    """A listening socket on host:port (port 0: a free one), bound before the model loads so a
    busy port fails in a second, not after the weights are read. OSError if it is taken."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def run_server(engine: Any, *, sock: Any, api_key: str | None = None) -> None:
    """Serve on a bound socket (see `bind`) until interrupted (SIGINT/SIGTERM)."""
    from rlvr.process import raise_open_files_limit

    raise_open_files_limit()  # one socket per client connection (the trainer's pool, judges' calls)
    app = create_app(engine, api_key=api_key)
    app.on_startup.append(_start_watchdog)
    host, port = sock.getsockname()[:2]
    log.info("rlvr embedded server on http://%s:%d (model %s)", host, port, engine.model_path)
    web.run_app(app, sock=sock, print=None, access_log=None)


WORKER_DIED = 3


async def _start_watchdog(app: web.Application) -> None:
    app["watchdog"] = asyncio.get_running_loop().create_task(watch(app[ENGINE_KEY]))


async def watch(engine: Any, interval_s: float = 0.5) -> None:
    """Exit the process (status 3) once the engine's worker is dead: a server that answers
    every request with 500 is worse than none, and the launcher's supervisor sees an exit."""
    while engine.worker_alive:
        await asyncio.sleep(interval_s)
    log.error("embedded engine worker died (%r); exiting", getattr(engine, "error", None))
    logging.shutdown()
    os._exit(WORKER_DIED)
