"""hermes calls as models write them: Qwen's one JSON object, or SmolLM2's list form (from APIGen's
function-calling data: `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`) holding one call;
a list of several is answered with an error the model can read (one call per turn)."""

from __future__ import annotations

import pytest

from rlvr.tools.formats import HermesFormat, Malformed, ToolCall
from tests.unit.tools.conftest import fake_tool


async def _price(item: str) -> str:
    return "5"


FORMAT = HermesFormat({"price": fake_tool("price", _price, "item")})
CALL = '{"name": "price", "arguments": {"item": "pear"}}'


@pytest.mark.parametrize("body", [CALL, f"[{CALL}]", f"[\n{CALL}\n]"], ids=["object", "list", "list-lines"])
def test_a_call_as_an_object_or_a_list_of_one(body: str) -> None:
    assert FORMAT.parse(f"Let me look.\n<tool_call>{body}</tool_call>") == ToolCall("price", {"item": "pear"})


def test_a_list_of_several_calls_is_answered_with_an_error() -> None:
    parsed = FORMAT.parse(f"<tool_call>[{CALL}, {CALL}]</tool_call>")
    assert parsed == Malformed("one tool call per turn, this one holds 2")
    assert isinstance(FORMAT.parse("<tool_call>[]</tool_call>"), Malformed)
