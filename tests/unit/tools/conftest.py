"""A scripted engine over rlvr.tiny's char tokenizer: each request gets the next scripted text."""

from __future__ import annotations

from typing import Any

import pytest

from rlvr.tools.base import Tool
from rlvr.tools.session import Toolbox
from rlvr.types import Completion


@pytest.fixture(scope="session")
def tokenizer():
    from rlvr.tiny import build_char_tokenizer

    return build_char_tokenizer()


class ScriptedEngine:
    """Request i is answered with `script[i]`: cut right after the first stop string it contains
    (finish "stop"), at the token budget ("length"), else whole plus EOS ("stop"). An entry
    `("abort", text)` comes back as an aborted partial answer. `inputs` records every request's
    input ids; logprobs are distinct negative numbers so tests can tell them from tool zeros."""

    def __init__(self, tokenizer: Any, script: list[Any]):
        self.tokenizer, self.script = tokenizer, list(script)
        self.inputs: list[list[int]] = []
        self.version = 0

    async def generate(self, requests: list[Any]) -> list[Completion]:
        (request,) = requests
        self.inputs.append(list(request.input_ids))
        item = self.script.pop(0)
        aborted = isinstance(item, tuple)
        text = item[1] if aborted else item
        finish = "abort" if aborted else "stop"
        eos: list[int] = []
        cuts = [text.find(s) + len(s) for s in request.params.stop if s in text]
        if cuts and not aborted:
            text = text[: min(cuts)]
        elif not aborted:
            eos = [self.tokenizer.eos_token_id]
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + eos
        if len(ids) > request.params.max_new_tokens:
            ids, finish = ids[: request.params.max_new_tokens], "length"
        start = sum(len(x) for x in self.inputs)
        return [
            Completion(
                text=text,
                token_ids=ids,
                logprobs=[-0.01 * (start + i + 1) for i in range(len(ids))],
                finish_reason=finish,
                prompt_token_ids=list(request.input_ids),
                policy_version=self.version,
            )
        ]


def fake_tool(name: str, fn: Any, *params: str) -> Tool:
    return Tool(
        name=name,
        description=f"fake {name}",
        parameters={"type": "object", "properties": {p: {"type": "string"} for p in params}, "required": list(params)},
        fn=fn,
    )


def toolbox(tokenizer: Any, tools: list[Tool], **kwargs: Any) -> Toolbox:
    options: dict[str, Any] = {"tool_format": "tags", "max_turns": 4, "max_tool_calls": 3, "timeout_s": 5.0,
                               "max_tokens": 400} | kwargs  # fmt: skip
    return Toolbox({t.name: t for t in tools}, tokenizer=tokenizer, **options)
