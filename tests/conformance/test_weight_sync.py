"""rlvr's BroadcastSync against SGLang 0.5.23's own weight-update code (gloo, CPU).

One "server" with tp_size = 2 is two processes running SGLang's `WeightUpdater` (see
sglang_tp_worker.py): they join the trainer's group with SGLang's
`init_custom_process_group` as ranks rank_offset + tp_rank, parse every body the client
sends with SGLang's request types, and rebuild each flattened bucket with SGLang's
`FlattenedTensorBucket`. What they receive must be byte-equal to the trainer's weights in
the engine's dtype.

What runs outside SGLang's code: HTTP itself and the scheduler's session rule, which
needs a live scheduler. The rule is restated here from
`sglang/srt/managers/scheduler_components/weight_updater.py` (0.5.23):
`update_weights_from_distributed` answers success False when `self._session is None`
(lines 192-196); `begin_weight_update` refuses an open session (311-316); `end_weight_update`
refuses without one (326-330).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import pytest
import torch
from torch import nn

from rlvr.rollout.sglang import SGLangClient
from rlvr.sync.broadcast import BroadcastSync
from rlvr.trainer.weights import iter_full_weights

from .sglang_env import popen_with_sglang

pytestmark = pytest.mark.sglang

URL = "http://sglang-tp2.invalid:30000"


class TinyLM(nn.Module):
    """Tied embedding/head, a bias, a buffer: every kind of tensor the trainer sends."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 24)
        self.proj = nn.Linear(24, 40)
        self.norm = nn.LayerNorm(40)
        self.head = nn.Linear(24, 64, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(0, 1, 7))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TPServer:
    """tp_size SGLang worker processes standing for one server, plus its session rule."""

    def __init__(self, site: Any, *, tp_size: int, dtype: str):
        port = _free_port()
        self.tp_size, self.dtype = tp_size, dtype
        self.procs = [
            popen_with_sglang(site, "sglang_tp_worker.py", str(r), str(tp_size), str(port)) for r in range(tp_size)
        ]
        for proc in self.procs:
            self._read(proc)
        self.session = False
        self.replies: list[tuple[str, list[dict[str, Any]]]] = []
        self.lock = threading.Lock()

    def _read(self, proc: Any) -> dict[str, Any]:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"SGLang worker exited: {proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def ask(self, command: dict[str, Any]) -> list[dict[str, Any]]:
        """Send to every tp worker first (a group join needs all), then read every answer."""
        with self.lock:
            for proc in self.procs:
                proc.stdin.write(json.dumps(command) + "\n")
                proc.stdin.flush()
            replies = [self._read(proc) for proc in self.procs]
        self.replies.append((command["op"], replies))
        return replies

    def handle(self, path: str, body: Any) -> Any:
        if path == "/server_info":
            return {"tp_size": self.tp_size, "dp_size": 1, "dtype": self.dtype}
        if path in ("/health", "/pause_generation", "/continue_generation", "/flush_cache"):
            return {"message": "ok"}
        if path == "/begin_weight_update":
            if self.session:
                return {"success": False, "message": "a weight-update session is already open"}
            self.session = True
            return {"success": True, "message": "Success"}
        if path == "/end_weight_update":
            if not self.session:
                return {"success": False, "message": "no weight-update session is open"}
            self.session = False
            return {"success": True, "message": "Success"}
        if path == "/update_weights_from_distributed" and not self.session:
            return {"success": False, "message": "update_weights_from_distributed must run between "
                    "begin_weight_update() and end_weight_update()"}  # fmt: skip
        op = {
            "/init_weights_update_group": "init",
            "/update_weights_from_distributed": "update",
            "/destroy_weights_update_group": "destroy",
        }[path]
        replies = self.ask({"op": op, "body": body})
        bad = [r for r in replies if not r.get("success")]
        return bad[0] if bad else replies[0]

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                proc.stdin.flush()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except Exception:  # noqa: BLE001
                proc.kill()


class ProcessClient(SGLangClient):
    """The real one-engine client of the sync, with HTTP replaced by the worker processes."""

    server: TPServer

    async def request(self, server, method, path, *, json=None, timeout_s=None):  # noqa: A002
        return await asyncio.to_thread(self.server.handle, path, json)


def _factory(tp: TPServer):
    def make(url: str) -> ProcessClient:
        client = ProcessClient([url], timeout_s=120, max_retries=0)
        client.server = tp
        return client

    return make


def test_sglang_tp_workers_join_and_receive_byte_equal_weights(sglang_site, tmp_path) -> None:
    """Both wire formats against one tp_size = 2 server (each sync builds its own group)."""
    torch.manual_seed(0)
    model = TinyLM()
    tp = TPServer(sglang_site, tp_size=2, dtype="bfloat16")
    loop_client = SGLangClient([URL])
    syncs = [
        BroadcastSync(
            model,
            client=loop_client,
            timeout_s=120,
            bucket_mb=0.002,  # several buckets
            backend="gloo",
            master_address="127.0.0.1",
            wire_format=wire_format,
            group_name=f"rlvr_{wire_format}",
            engine_factory=_factory(tp),
        )
        for wire_format in ("flattened_bucket", "per_tensor")
    ]
    try:
        syncs[0].push(version=3)
        syncs[0].push(version=4)  # the group is reused
        with torch.no_grad():
            model.proj.weight.mul_(-2)
        metrics = syncs[1].push(version=5)
        dumps = [tmp_path / f"tp{r}.pt" for r in range(2)]
        for r, path in enumerate(dumps):
            tp.procs[r].stdin.write(json.dumps({"op": "dump", "path": str(path)}) + "\n")
            tp.procs[r].stdin.flush()
            assert tp._read(tp.procs[r])["ok"]
    finally:
        for sync in syncs:
            sync.close()
        tp.close()
    inits = [replies for op, replies in tp.replies if op == "init"]
    assert len(inits) == 2, "one group per sync, reused across its pushes"
    for replies in inits:
        assert sorted((r["rank"], r["group_rank"], r["group_size"]) for r in replies) == [(1, 1, 3), (2, 2, 3)]
    assert all(r["success"] for op, replies in tp.replies if op == "update" for r in replies)
    versions = [replies[0]["weight_version"] for op, replies in tp.replies if op == "update"]
    assert [v for v in versions if v] == ["3", "4", "5"] and versions[-1] == "5"
    assert metrics["sync/buckets"] >= 3
    expected = {name: t.to(torch.bfloat16) for name, t in iter_full_weights(model)}
    for path in dumps:
        got = torch.load(path)
        assert list(got) == list(expected)
        for name, tensor in expected.items():
            assert got[name].dtype == torch.bfloat16 and got[name].shape == tensor.shape
            assert torch.equal(got[name].view(torch.uint8), tensor.contiguous().view(torch.uint8)), name
