"""Verified pushes (`sync.verify`): after the last bucket, each engine's fingerprint of the weights
it serves is compared with the trainer's fingerprint of what it sent.

A mismatch is a failed push like any other engine failure (`on_engine_failure`), reported in one
line with the engine's URL and the first tensor that differs. "auto" verifies the engines that
have the route: `rlvr serve` and the in-process engine (what they serve), vLLM through rlvr's
backend (what each worker received and loaded); SGLang has none.
docs/weight-sync.md ("Verified pushes").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from rlvr.rollout.base import EMBEDDED_ENGINE
from rlvr.rollout.vllm import VLLM_ENGINE
from rlvr.sync.base import EngineFailure
from rlvr.sync.fingerprint import Checksum, Fingerprinter, first_difference

if TYPE_CHECKING:
    from torch import Tensor, nn

    from rlvr.sync.engine_calls import EngineCalls

VERIFY_MODES = ("auto", "on", "off")
STAGE = "verify"
ADAPTER_PREFIX = "adapter:"  # an adapter tensor's name in a fingerprint: "adapter:" + its peft key


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Names the trainer does not send because they share a sent tensor (a tied head) -> that name."""
    from rlvr.trainer.weights import weight_sources

    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, tensor, _ in weight_sources(model, skip_tied=False):
        source = first.setdefault(id(tensor), name)
        if source != name:
            aliases[name] = source
    return aliases


def mismatch(url: str, sent: Mapping[str, Checksum], served: object) -> EngineFailure | None:
    """The failure of an engine whose fingerprint (`served`) differs from `sent`, else None."""
    if isinstance(served, BaseException):
        return EngineFailure(url, STAGE, f"no weights fingerprint: {type(served).__name__}: {served}")
    if not isinstance(served, Mapping):
        return EngineFailure(url, STAGE, f"no weights fingerprint: got {type(served).__name__}")
    name = first_difference(sent, cast("Mapping[str, Sequence[float]]", served))
    if name is None:
        return None
    return EngineFailure(url, STAGE, f"served weights differ from those sent, first at {name}")


class PushVerifier:
    """One sync's verification: the trainer's fingerprint of the current push and the engines to ask.

    `start()` before a push's first tensor, `add(name, tensor)` for each tensor as sent (rank 0),
    `check(calls, urls)` after the last bucket; `seconds` is what this push spent on it, `verified` the
    engines whose fingerprint was compared and equal (`sync/verified_engines`). An adapter
    push (`adapter`) records the adapter's tensors, as `ADAPTER_PREFIX + key`, and asks the engines
    for the adapter tensors they merged."""

    def __init__(self, model: nn.Module, *, mode: str, adapter: bool = False) -> None:
        if mode not in VERIFY_MODES:
            raise ValueError(f"sync.verify must be one of {VERIFY_MODES}, got {mode!r}")
        self.mode = mode
        self.adapter = adapter  # compare the adapter tensors the engines loaded, not their weights
        self.aliases = tied_aliases(model) if mode != "off" and not adapter else {}
        self.recorder = Fingerprinter()
        self.seconds = 0.0
        self.engine_seconds = 0.0  # of `seconds`: waiting for the engines' fingerprints
        self.verified = 0  # engines whose fingerprint equalled the trainer's, this push
        self._kinds: dict[str, bool] = {}  # url -> has the route (auto)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def start(self) -> None:
        self.recorder = Fingerprinter()
        for name, source in self.aliases.items():
            self.recorder.alias(name, of=source)
        self.seconds = self.engine_seconds = 0.0
        self.verified = 0

    def add(self, name: str, tensor: Tensor) -> None:
        if self.mode == "off":
            return
        begin = time.monotonic()
        self.recorder.add(name, tensor)
        self.seconds += time.monotonic() - begin

    def sent(self) -> dict[str, Checksum]:
        begin = time.monotonic()
        result = self.recorder.result()
        self.seconds += time.monotonic() - begin
        return result

    def check(self, calls: EngineCalls, urls: Sequence[str]) -> list[EngineFailure]:
        """Ask every engine to verify for its fingerprint (concurrently, with the sync's deadline);
        returns those that differ or do not answer."""
        if self.mode == "off":
            return []
        sent = self.sent()
        begin = time.monotonic()
        targets = [u for u in urls if self._verifiable(calls, u)]
        asked = time.monotonic()
        answers = calls.results(targets, "weights_fingerprint", **({"adapter": True} if self.adapter else {}))
        self.engine_seconds = time.monotonic() - asked
        failures = [
            EngineFailure(u, STAGE, "the engine has no weights fingerprint") for u in targets if u not in answers
        ]
        for url, served in answers.items():
            failure = mismatch(url, sent, served)
            if failure is not None:
                failures.append(failure)
            else:
                self.verified += 1
        self.seconds += time.monotonic() - begin
        return failures

    def _verifiable(self, calls: EngineCalls, url: str) -> bool:
        """On: every engine. Auto: an embedded engine, its own object or a server whose /server_info
        says it is `rlvr serve` or vLLM with rlvr's backend (SGLang's client has the call, SGLang not
        the route)."""
        if self.mode == "on":
            return True
        if url not in self._kinds:
            client = calls.one(url)
            if not hasattr(client, "weights_fingerprint"):
                self._kinds[url] = False
            elif not hasattr(client, "server_info"):
                self._kinds[url] = True
            else:
                info = calls.results([url], "server_info").get(url)
                engine = cast("dict[str, object]", info).get("engine") if isinstance(info, dict) else None
                self._kinds[url] = engine in (EMBEDDED_ENGINE, VLLM_ENGINE)
        return self._kinds[url]
