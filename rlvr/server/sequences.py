"""The embedded engine's sequences: one per sample of a request, checked and seeded on the way in,
stopped and detokenized on the way out by SGLang's rules (docs/engines.md, "Stop tokens").

A sequence's randomness is its own seeded `random.Random`, so what it samples never depends on
which other sequences share the batch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlvr.rollout.base import GenerateRequest, SamplingParams, parse_version
from rlvr.types import Completion


@dataclass(slots=True, eq=False)
class Seq:
    """One sequence being generated (one of a request's n samples)."""

    prompt: list[int]
    params: SamplingParams
    rng: random.Random
    on_done: Callable[[Seq], None]
    stop_ids: frozenset[int]
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the slot's cache
    finish: dict[str, Any] | None = None
    text: str = ""
    version: str = "0"
    started: float = field(default_factory=time.monotonic)

    @property
    def pending(self) -> int:
        return self.out[-1]


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every end-of-sequence id the generation config, the model config or the tokenizer names."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def make_seqs(request: GenerateRequest, *, max_len: int, vocab: int, eos: frozenset[int]) -> list[Seq]:
    """The request's n sequences, after checking what would otherwise fail inside the worker's step."""
    if not request.input_ids:
        raise ValueError("empty prompt")
    if len(request.input_ids) >= max_len:
        raise ValueError(f"prompt has {len(request.input_ids)} tokens; the engine's max_len is {max_len}")
    bad = next((t for t in request.input_ids if not 0 <= t < vocab), None)
    if bad is not None:  # an out-of-range id would fail inside the worker's step, for every request
        raise ValueError(f"input_ids: token id {bad} is outside the vocabulary [0, {vocab})")
    bad = next((t for t in request.params.stop_token_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ValueError(f"stop_token_ids: token id {bad} is outside the vocabulary [0, {vocab})")
    if request.n < 1:
        raise ValueError(f"n: must be at least 1, got {request.n}")
    params = request.params
    stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eos)
    seqs = []
    for j in range(request.n):
        seed = params.seed + j if params.seed is not None else random.getrandbits(63)
        seqs.append(Seq(list(request.input_ids), params, random.Random(seed), _undelivered, stop_ids))
    return seqs


def _undelivered(seq: Seq) -> None:
    """A sequence's `on_done` until the caller binds its own."""


def stop_reason(seq: Seq, token: int, *, tokenizer: Any, max_len: int) -> dict[str, Any] | None:
    """SGLang's finish_reason once `token` was appended, or None while the sequence goes on."""
    if token in seq.stop_ids:
        return {"type": "stop", "matched": token}
    if seq.params.stop:
        window = max(len(s) for s in seq.params.stop) + 8
        tail = tokenizer.decode(seq.out[-window:], skip_special_tokens=seq.params.skip_special_tokens)
        for stop in seq.params.stop:
            if stop and stop in tail:
                return {"type": "stop", "matched": stop}
    if len(seq.out) >= seq.params.max_new_tokens:
        return {"type": "length", "length": len(seq.out)}
    if seq.cached + 1 >= max_len:  # prompt + output fill the context (SGLang's context_length)
        return {"type": "length", "length": len(seq.out)}
    return None


def finished_text(seq: Seq, reason: dict[str, Any], *, tokenizer: Any) -> str:
    """The text of a finished sequence, its matched stop cut off."""
    # A matched stop token stays in token_ids but not in the text, as SGLang's detokenizer
    # trims it (`trim_matched_stop`) whatever skip_special_tokens says: with
    # skip_special_tokens=False, or a stop id that is an ordinary token, the text showed it.
    ids = seq.out[:-1] if isinstance(reason.get("matched"), int) else seq.out
    text = tokenizer.decode(ids, skip_special_tokens=seq.params.skip_special_tokens)
    if isinstance(reason.get("matched"), str):
        cut = text.find(reason["matched"])
        if cut >= 0:
            text = text[:cut]
    return text


def to_completion(seq: Seq) -> Completion:
    finish = seq.finish or {"type": "abort"}
    return Completion(
        text=seq.text,
        token_ids=list(seq.out),
        logprobs=list(seq.logprobs),
        finish_reason=str(finish["type"]),
        prompt_token_ids=list(seq.prompt),
        policy_version=parse_version(seq.version),
    )
