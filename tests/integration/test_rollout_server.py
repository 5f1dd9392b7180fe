"""The SGLang-protocol client against `rlvr serve` in a real subprocess on loopback.

One server process (tiny model, ephemeral port, API key) serves the whole module; the
tests drive it only through HTTP, as the RL loop drives SGLang servers.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import pytest
import torch

from rlvr.process import free_port
from rlvr.recipe.schema import RolloutConfig
from rlvr.rollout.base import GenerateRequest, RolloutClient, RolloutError, SamplingParams
from rlvr.rollout.sglang import SGLangClient
from tests.conftest import build_embedded_server_command, build_sharp_model_dir, embedded_server

API_KEY = "test-key"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sharp_model_dir(tmp_path_factory.mktemp("rollout-server") / "sharp")


@pytest.fixture(scope="module")
def server(model_dir: Path):
    with embedded_server(model_dir, log=model_dir.parent / "server.log", max_batch=8, api_key=API_KEY) as url:
        yield url


@pytest.fixture
async def client(server: str):
    async with SGLangClient([server], api_key=API_KEY, timeout_s=60, backoff_s=0.05) as c:
        await c.wait_ready(timeout_s=60)
        yield c


def _tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


async def _post(url: str, path: str, payload: dict, *, key: str | None = API_KEY) -> tuple[int, object]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession(headers=headers) as session, session.post(url + path, json=payload) as resp:
        return resp.status, await resp.json(content_type=None) if resp.status != 204 else None


async def test_client_generates_with_logprobs_matching_a_full_forward(client, model_dir):
    from transformers import AutoModelForCausalLM

    assert isinstance(client, RolloutClient)
    tok = _tokenizer(model_dir)
    prompts = ["hello", "the quick brown fox", "solve: 2+2="]
    params = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    out = await client.generate([GenerateRequest(tok.encode(p), params, n=2) for p in prompts])
    assert len(out) == 6 and out[0].token_ids == out[1].token_ids
    reference = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for completion in out:
        assert completion.finish_reason == "length" and len(completion.token_ids) == 12
        assert completion.text == tok.decode(completion.token_ids)
        ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(reference(ids).logits[0].float(), -1)[len(completion.prompt_token_ids) - 1 : -1]
        expected = logp.gather(1, torch.tensor(completion.token_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


async def test_sglang_wire_format(server, model_dir):
    status, body = await _post(
        server,
        "/generate",
        {
            "text": ["hi", "yo"],
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "n": 2},
            "return_logprob": True,
        },
    )
    assert status == 200 and isinstance(body, list) and len(body) == 4
    first = body[0]
    assert set(first) >= {"text", "output_ids", "meta_info"}
    meta = first["meta_info"]
    assert meta["finish_reason"]["type"] in ("length", "stop")
    assert meta["prompt_tokens"] == 2 and meta["completion_tokens"] == len(first["output_ids"])
    assert isinstance(meta["weight_version"], str)
    assert [entry[1] for entry in meta["output_token_logprobs"]] == first["output_ids"]
    assert all(entry[2] is None for entry in meta["output_token_logprobs"])
    status, single = await _post(
        server, "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}
    )
    assert status == 200 and isinstance(single, dict) and "output_token_logprobs" not in single["meta_info"]
    status, _ = await _post(server, "/generate", {"sampling_params": {}})
    assert status == 400


async def test_seeded_sampling_is_reproducible_over_http(client, model_dir):
    tok = _tokenizer(model_dir)
    request = GenerateRequest(tok.encode("hello"), SamplingParams(temperature=1.0, max_new_tokens=16, seed=7), n=3)
    a = await client.generate([request])
    b = await client.generate([request])
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert len({tuple(c.token_ids) for c in a}) == 3


async def test_stop_strings_over_http(client, model_dir):
    tok = _tokenizer(model_dir)
    prompt = tok.encode("the quick brown fox")
    free = (await client.generate([GenerateRequest(prompt, SamplingParams(temperature=0, max_new_tokens=20))]))[0]
    stop = free.text[6:8]
    out = (
        await client.generate([GenerateRequest(prompt, SamplingParams(temperature=0, max_new_tokens=20, stop=[stop]))])
    )[0]
    assert out.finish_reason == "stop" and out.text == free.text[: free.text.find(stop)]


async def test_api_key_is_required_except_for_health(server):
    async with aiohttp.ClientSession() as session:
        async with session.get(server + "/health") as resp:
            assert resp.status == 200
        async with session.get(server + "/model_info") as resp:
            assert resp.status == 401
    status, _ = await _post(server, "/generate", {"text": "hi"}, key="wrong")
    assert status == 401
    async with SGLangClient([server], api_key="wrong", timeout_s=10) as bad:
        with pytest.raises(RolloutError, match="401"):
            await bad.generate([GenerateRequest([5, 6], SamplingParams(max_new_tokens=2))])


async def test_openai_chat_route(server):
    payload = {"model": "m", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 5, "temperature": 0}
    status, body = await _post(server, "/v1/chat/completions", payload)
    assert status == 200
    assert body["object"] == "chat.completion"  # type: ignore[index]
    choice = body["choices"][0]  # type: ignore[index]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert body["usage"]["completion_tokens"] <= 5  # type: ignore[index]
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]  # type: ignore[index]


async def test_openai_chat_logprobs_are_the_sampled_tokens(server):
    payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0, "logprobs": True}
    status, body = await _post(server, "/v1/chat/completions", payload)
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]  # type: ignore[index]
    assert len(content) == body["usage"]["completion_tokens"] > 0  # type: ignore[index]
    assert all(isinstance(t["logprob"], float) and t["logprob"] <= 0 for t in content)
    assert "".join(t["token"] for t in content) == body["choices"][0]["message"]["content"]  # type: ignore[index]


async def test_openai_completions_route_with_logprobs(server):
    payload = {"prompt": ["hello", "the fox"], "max_tokens": 4, "temperature": 0, "logprobs": 0, "n": 2}
    status, body = await _post(server, "/v1/completions", payload)
    assert status == 200, body
    assert body["object"] == "text_completion" and len(body["choices"]) == 4  # type: ignore[index]
    first = body["choices"][0]  # type: ignore[index]
    assert isinstance(first["text"], str) and first["finish_reason"] in ("stop", "length")
    assert len(first["logprobs"]["tokens"]) == len(first["logprobs"]["token_logprobs"]) <= 4


async def test_openai_stream_sends_server_sent_events_with_the_same_text(server):
    payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0}
    _, whole = await _post(server, "/v1/chat/completions", payload)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.post(server + "/v1/chat/completions", json={**payload, "stream": True}) as resp,
    ):
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in (await resp.text()).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("route", "payload", "named"),
    [
        ("/v1/chat/completions", {"max_tokens": -3}, "max_tokens"),
        ("/v1/chat/completions", {"temperature": -1}, "temperature"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 3}, "top_logprobs"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 5}, "logprobs"),
        ("/v1/completions", {"prompt": "hi", "echo": True}, "echo"),
        ("/v1/completions", {"prompt": 7}, "prompt"),
    ],
)
async def test_openai_routes_reject_what_they_cannot_honour(server, route, payload, named):
    messages = {"messages": [{"role": "user", "content": "hi"}]} if route.endswith("chat/completions") else {}
    status, body = await _post(server, route, {**messages, **payload})
    assert status == 400
    assert body["error"]["message"].startswith(named), body  # type: ignore[index]


def test_serve_port_in_use_is_one_line_and_exit_2(model_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "rlvr.cli", "serve", str(model_dir), "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == proc.stderr.strip().splitlines()[0]
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in proc.stderr and "Traceback" not in proc.stderr


def test_serve_missing_model_folder_is_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "serve", str(tmp_path / "none")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "no model folder here" in proc.stderr


def test_serve_port_0_prints_the_bound_port(model_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlvr.cli", "serve", str(model_dir), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        while not any("ready on" in line for line in lines):
            line = proc.stdout.readline()
            assert line, f"server exited: {lines}"
            lines.append(line)
        port = int(lines[-1].split("http://127.0.0.1:")[1].split()[0])
        assert port != 0 and f":{port}" in lines[0]  # the loading line already named it
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_pause_holds_new_requests_until_continue(client, server):
    await client.pause("in_place")
    try:
        task = asyncio.create_task(client.generate([GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=3))]))
        await asyncio.sleep(0.5)
        assert not task.done()
    finally:
        await client.resume()
    out = await asyncio.wait_for(task, 30)
    assert len(out[0].token_ids) <= 3

    long = GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=1000, ignore_eos=True), n=8)
    task = asyncio.create_task(client.generate([long]))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as session:
        for _ in range(500):  # wait until the server is decoding it
            async with session.get(server + "/server_info") as resp:
                if (await resp.json())["running"] > 0:
                    break
            await asyncio.sleep(0.01)
    await client.pause("abort")
    try:
        aborted = await asyncio.wait_for(task, 30)
        assert {c.finish_reason for c in aborted} == {"abort"}
        assert all(len(c.token_ids) < 1000 for c in aborted)
    finally:
        await client.resume()


async def test_update_weights_from_disk_changes_outputs_and_version(client, server, model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    tok = _tokenizer(model_dir)
    request = GenerateRequest(tok.encode("hello"), SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True))
    before = (await client.generate([request]))[0]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        torch.manual_seed(3)
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.5)
    model.save_pretrained(tmp_path / "v5")
    try:
        await client.update_weights_from_disk(str(tmp_path / "v5"), version=5)
        after = (await client.generate([request]))[0]
        assert after.policy_version == 5 and after.token_ids != before.token_ids
        with pytest.raises(RolloutError, match="success|safetensors|400"):
            await client.update_weights_from_disk(str(tmp_path / "missing"))
    finally:
        await client.update_weights_from_disk(str(model_dir), version=0)
    restored = (await client.generate([request]))[0]
    assert restored.token_ids == before.token_ids and restored.policy_version == 0


async def test_update_weights_from_distributed_with_an_in_test_sender(client, model_dir):
    """This process plays trainer rank 0: it hosts the group and broadcasts perturbed weights."""
    from transformers import AutoModelForCausalLM

    from rlvr.sync.group import dtype_name, join_group, send_broadcast

    tok = _tokenizer(model_dir)
    request = GenerateRequest(tok.encode("hello"), SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True))
    before = (await client.generate([request]))[0]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        torch.manual_seed(4)
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.5)
    port = free_port()
    holder: dict[str, object] = {}

    def host():
        holder["group"] = join_group(master_address="127.0.0.1", master_port=port, rank=0, world_size=2, timeout_s=60)

    thread = threading.Thread(target=host)
    thread.start()
    await client.init_weights_update_group(
        master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2, backend="gloo"
    )
    await asyncio.to_thread(thread.join, 60)
    group = holder["group"]

    named = list(model.named_parameters())
    buckets = [named[: len(named) // 2], named[len(named) // 2 :]]
    with pytest.raises(RolloutError, match="between begin_weight_update"):  # SGLang 0.5.23: sessions only
        await client.update_weights_from_distributed(["x"], ["float32"], [[1]])
    await client.begin_weight_update()
    with pytest.raises(RolloutError, match="already open"):
        await client.begin_weight_update()
    for i, bucket in enumerate(buckets):
        version = 7 if i == len(buckets) - 1 else None
        names = [n for n, _ in bucket]
        update = asyncio.create_task(
            client.update_weights_from_distributed(
                names, [dtype_name(t.dtype) for _, t in bucket], [list(t.shape) for _, t in bucket], version=version
            )
        )
        await asyncio.to_thread(send_broadcast, group, [t.detach() for _, t in bucket])
        await asyncio.wait_for(update, 60)
    await client.end_weight_update()
    await client.destroy_weights_update_group()
    with pytest.raises(RolloutError, match="does not exist"):
        await client.destroy_weights_update_group()
    after = (await client.generate([request]))[0]
    assert after.policy_version == 7 and after.token_ids != before.token_ids

    from rlvr.server.embedded import EmbeddedEngine

    local = EmbeddedEngine(model_dir, max_batch=2, device="cpu")
    try:
        local.load_state_dict(dict(model.named_parameters()), version="7")
        assert local.generate_sync([request])[0].token_ids == after.token_ids
    finally:
        local.close()
        await client.update_weights_from_disk(str(model_dir), version=0)


async def test_dead_server_is_skipped_and_requests_rerouted(server):
    dead = f"http://127.0.0.1:{free_port()}"
    async with SGLangClient([dead, server], api_key=API_KEY, timeout_s=30, backoff_s=0.01) as c:
        out = await c.generate([GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=2), n=1) for _ in range(6)])
        assert len(out) == 6
        assert c.live_servers == [server]
        assert await c.health()
    async with SGLangClient([dead], timeout_s=5, max_retries=1, backoff_s=0.01) as c:
        with pytest.raises(RolloutError):
            await c.generate([GenerateRequest([5, 6], SamplingParams(max_new_tokens=2))])
        assert not await c.health()


def test_server_command_is_runnable_python():
    argv = build_embedded_server_command(RolloutConfig(max_batch=4), model_path="/m", port=1234)
    assert argv[:3] == [sys.executable, "-m", "rlvr.server.commands"]
    assert "--max-batch" in argv and argv[argv.index("--max-batch") + 1] == "4"


async def test_seeds_follow_sglang_and_the_client_gives_each_sample_its_own(server, client, model_dir):
    """The twin seeds all n samples of one item alike, as SGLang does (identical samples);
    the client therefore sends a seeded group as n items with seeds seed + j, which differ."""
    tok = _tokenizer(model_dir)
    params = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True, "n": 4, "sampling_seed": 5}
    status, raw = await _post(server, "/generate", {"input_ids": tok.encode("hello"), "sampling_params": params})
    assert status == 200 and isinstance(raw, list) and len({tuple(o["output_ids"]) for o in raw}) == 1
    request = GenerateRequest(
        tok.encode("hello"), SamplingParams(temperature=1.0, max_new_tokens=12, ignore_eos=True, seed=5), n=4
    )
    group = await client.generate([request])
    assert len(group) == 4 and len({tuple(c.token_ids) for c in group}) == 4
    assert [c.token_ids for c in await client.generate([request])] == [c.token_ids for c in group]  # reproducible


BAD_REQUESTS = [
    ({"input_ids": [1000000000]}, "input_ids"),
    ({"input_ids": [-1]}, "input_ids"),
    ({"input_ids": [1, 2], "sampling_params": {"n": 0}}, "sampling_params.n"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -3}}, "sampling_params.max_new_tokens"),
    ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"input_ids": [1, 2], "sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
    ({"input_ids": [1, 2], "sampling_params": {"stop_token_ids": [10**9]}}, "stop_token_ids"),
    ({"input_ids": [1, 2], "sampling_params": {"tempreature": 1}}, "tempreature"),
    ({"input_ids": [1, 2], "smapling_params": {}}, "smapling_params"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": ["a"]}, "input_ids"),
]


async def test_bad_requests_are_400_naming_the_field_and_the_engine_survives_them(server, model_dir):
    """Concurrent good requests interleaved with every bad one: each bad one is a 400 that
    names its field; the good ones, and one after all of them, still succeed."""
    tok = _tokenizer(model_dir)
    good = {"input_ids": tok.encode("hello"), "sampling_params": {"max_new_tokens": 6, "n": 2}}
    calls = []
    for bad, _ in BAD_REQUESTS:
        calls += [_post(server, "/generate", good), _post(server, "/generate", bad)]
    results = await asyncio.gather(*calls)
    for (bad, field), (status, body) in zip(BAD_REQUESTS, results[1::2], strict=True):
        assert status == 400 and field in str(body), (bad, status, body)
    assert all(status == 200 for status, _ in results[0::2])
    status, out = await _post(server, "/generate", good)
    assert status == 200 and len(out) == 2  # type: ignore[arg-type]
    status, _ = await _post(server, "/update_weights_from_disk", {"model_path": str(model_dir), "bogus": 1})
    assert status == 400  # unknown fields are refused on every route, not silently dropped


async def test_requests_sent_while_paused_wait_before_the_engine_and_flush_succeeds(client, model_dir):
    """SGLang's tokenizer manager holds a request that arrives during a pause before its scheduler
    (tokenizer_manager.py: `is_pause_cond.wait_for(lambda: not self.is_pause)`), so a weight update's
    /flush_cache still succeeds; an asynchronous rollout's resend can land in that window."""
    tok = _tokenizer(model_dir)
    await client.pause("abort")
    try:
        task = asyncio.create_task(
            client.generate([GenerateRequest(tok.encode("hi"), SamplingParams(max_new_tokens=4))])
        )
        await asyncio.sleep(0.3)
        assert not task.done()
        await client.flush_cache()  # the waiting request is not "running"
    finally:
        await client.resume()
    (out,) = await asyncio.wait_for(task, 30)
    assert out.finish_reason != "abort" and len(out.token_ids) <= 4


async def test_flush_cache_is_refused_while_requests_run(server, client, model_dir):
    tok = _tokenizer(model_dir)
    long = GenerateRequest(tok.encode("hi"), SamplingParams(max_new_tokens=400, ignore_eos=True))
    task = asyncio.create_task(client.generate([long]))
    try:
        deadline = time.monotonic() + 30
        refused = False
        while time.monotonic() < deadline and not task.done():
            try:
                await client.flush_cache()
            except RolloutError as exc:
                refused = "HTTP 400" in str(exc)
                break
            await asyncio.sleep(0.01)
        assert refused or task.done()
    finally:
        await client.pause("abort")
        await client.resume()
        await task
    await client.flush_cache()  # idle: fine


def test_a_dead_engine_worker_stops_the_server(tmp_path):
    """If the worker thread dies the process exits non-zero instead of answering 500s forever."""
    from rlvr.server import routes as srv

    script = tmp_path / "die.py"
    script.write_text(
        "import asyncio, sys\n"
        "from rlvr.server import routes as srv\n"
        "class E:\n    worker_alive = False\n    _error = RuntimeError('boom')\n"
        "asyncio.run(srv.watch(E(), interval_s=0.01))\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == srv.WORKER_DIED, proc.stderr
