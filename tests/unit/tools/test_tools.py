"""The built-in tools (python in the sandbox, BM25 search), plug-ins, formats and registry checks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rlvr.tools.base import ToolConfigError
from rlvr.tools.formats import HermesFormat, Malformed, TagsFormat, ToolCall, Unfinished
from rlvr.tools.python import python_tool
from rlvr.tools.registry import build_tools, check_tools, plugin_tool, schema_of
from rlvr.tools.search import search_tool
from tests.unit.tools.conftest import fake_tool, toolbox

PLUGIN = "tests.unit.tools.plugin_example:lookup_price"


def _domain(**kw):
    base = {"tools": [], "tool_timeout_s": 5.0, "search_corpus": None, "search_url": None, "search_top_k": 2}
    return SimpleNamespace(**(base | kw))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    rows = [
        {"title": "Zorblat", "text": "The capital of Zorblat is Quenmoor."},
        {"title": "Fruit", "text": "Bananas are yellow and grow in bunches."},
        {"title": "Rivers", "text": "The Vell river flows through Quenmoor to the sea."},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


async def test_python_tool_runs_code_in_the_sandbox_and_returns_stdout():
    tool = python_tool(timeout_s=10)
    assert (await tool.fn(code="print(123 * 456)")).strip() == "56088"
    failing = await tool.fn(code="raise ValueError('nope')")
    assert "ValueError: nope" in failing
    assert "no output" in await tool.fn(code="x = 1")


async def test_python_tool_is_stateless_per_call():
    tool = python_tool(timeout_s=10)
    await tool.fn(code="open('state.txt', 'w').write('1'); x = 5")
    out = await tool.fn(code="import os; print(os.path.exists('state.txt'), 'x' in globals())")
    assert out.strip() == "False False"


async def test_python_tool_timeout_is_a_counted_timeout_answer(tokenizer):
    box = toolbox(tokenizer, [python_tool(timeout_s=1)], timeout_s=1)
    session = box.session()
    reply = await session.respond("<code>while True: pass</code>")
    assert reply is not None and "error: python timed out after 1s" in reply.text
    assert session.stats()["tool_timeouts"] == 1


async def test_search_returns_the_matching_passages(corpus):
    tool = search_tool(corpus=str(corpus), top_k=2)
    answer = await tool.fn(query="capital of Zorblat")
    assert answer.splitlines()[0] == "Doc 1 (Title: Zorblat) The capital of Zorblat is Quenmoor."
    assert "Bananas" not in answer
    assert await tool.fn(query="the of and") == "No passage matches."
    assert await tool.fn(query="xylophone") == "No passage matches."


def test_search_corpus_missing_or_bad_is_a_clear_error(tmp_path):
    with pytest.raises(ToolConfigError, match="search corpus '.*nowhere.jsonl' does not exist"):
        search_tool(corpus=str(tmp_path / "nowhere.jsonl"), top_k=3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(ToolConfigError, match=r"bad.jsonl:2: a passage needs a string 'text'"):
        search_tool(corpus=str(bad), top_k=3)
    with pytest.raises(ToolConfigError, match="needs search_corpus"):
        search_tool(corpus=None, top_k=3)


def test_plugin_schema_comes_from_signature_and_docstring():
    tool = plugin_tool(PLUGIN)
    assert tool.name == "lookup_price" and tool.description == "Price of a fruit in cents."
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "item": {"type": "string", "description": "The fruit's name."},
            "quantity": {"type": "integer", "description": "How many."},
        },
        "required": ["item"],
    }
    assert schema_of(lambda a, *rest, b=2, **kw: 0)[1]["required"] == ["a"]


async def test_plugin_runs_through_a_session_in_both_formats(tokenizer):
    tools = build_tools(_domain(tools=[PLUGIN]))
    session = toolbox(tokenizer, list(tools.values()), tool_format="hermes").session()
    reply = await session.respond(
        '<tool_call>{"name": "lookup_price", "arguments": {"item": "pear", "quantity": 3}}</tool_call>'
    )
    assert reply is not None and reply.text == "\ntool: 15\nassistant: "  # the char tokenizer's template
    session = toolbox(tokenizer, list(tools.values())).session()
    reply = await session.respond("<lookup_price>apple</lookup_price>")
    assert reply is not None and "<result>\n3\n</result>" in reply.text
    reply = await session.respond('<lookup_price>{"item": "kiwi"}</lookup_price>')
    assert reply is not None and "error: lookup_price failed: KeyError" in reply.text


def test_check_tools_names_the_problem(corpus):
    assert check_tools(_domain(tools=["python", "search", PLUGIN], search_corpus=str(corpus))) is None
    assert "unknown tool 'calculator'" in (check_tools(_domain(tools=["calculator"])) or "")
    assert "cannot import" in (check_tools(_domain(tools=["no_such_pkg.mod:fn"])) or "")
    assert "has no attribute 'missing'" in (
        check_tools(_domain(tools=["tests.unit.tools.plugin_example:missing"])) or ""
    )
    assert "not a function" in (check_tools(_domain(tools=["tests.unit.tools.plugin_example:NOT_A_FUNCTION"])) or "")
    assert "needs search_corpus" in (check_tools(_domain(tools=["search"])) or "")
    assert "listed twice" in (check_tools(_domain(tools=["python", "python"])) or "")


def test_tags_format_parses_only_a_call_that_ends_the_turn():
    fmt = TagsFormat({"python": fake_tool("python", None, "code"), "search": fake_tool("search", None, "query")})
    assert fmt.stop == ["</code>", "</search>", "```\n"]
    assert fmt.parse("x <code>print(1)</code>") == ToolCall("python", {"code": "print(1)"})
    assert fmt.parse("<search>who</search>\n") == ToolCall("search", {"query": "who"})
    assert fmt.parse("```python\nprint(2)\n```\n") == ToolCall("python", {"code": "print(2)"})
    assert fmt.parse("```\n") == Unfinished()
    assert fmt.parse("<code>1</code> so the answer is 4") is None
    assert fmt.parse("<code>1</code>.") == ToolCall("python", {"code": "1"})  # a token that ran past the stop
    assert fmt.parse("```js\nx\n```\n") is None
    assert fmt.parse("no call") is None
    assert isinstance(fmt.parse("<code>  </code>"), Malformed)


def test_hermes_format_parses_json_calls():
    fmt = HermesFormat({"add": fake_tool("add", None, "a")})
    assert fmt.parse('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>') == ToolCall("add", {"a": 1})
    assert fmt.parse('<tool_call>{"name": "add", "arguments": "{\\"a\\": 2}"}</tool_call>') == ToolCall("add", {"a": 2})
    assert isinstance(fmt.parse('<tool_call>{"arguments": {}}</tool_call>'), Malformed)
    assert isinstance(fmt.parse('<tool_call>{"name": "add", "arguments": [1]}</tool_call>'), Malformed)
    assert fmt.parse("plain answer") is None
    assert '"name": "add"' in fmt.instructions()


def test_toolbox_adds_the_instructions_to_the_system_message(tokenizer):
    box = toolbox(tokenizer, [fake_tool("python", None, "code")])
    messages = box.prompt_messages([{"role": "user", "content": "hi"}])
    assert messages[0]["role"] == "system" and "<code>" in messages[0]["content"] and messages[1]["content"] == "hi"
    merged = box.prompt_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert len(merged) == 2 and merged[0]["content"].startswith("Be brief.\n\n")


async def test_search_from_a_retrieval_server_and_a_server_down(tokenizer, unused_tcp_port):
    from aiohttp import web

    seen = []

    async def retrieve(request):
        body = await request.json()
        seen.append(body)
        docs = [{"document": {"id": "1", "contents": '"Zorblat"\nThe capital of Zorblat is Quenmoor.'}, "score": 3.0}]
        return web.json_response({"result": [docs]})

    app = web.Application()
    app.router.add_post("/retrieve", retrieve)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        tool = build_tools(_domain(tools=["search"], search_url=f"http://127.0.0.1:{unused_tcp_port}"))["search"]
        assert await tool.fn(query="capital") == "Doc 1 (Title: Zorblat) The capital of Zorblat is Quenmoor."
        assert seen == [{"queries": ["capital"], "topk": 2, "return_scores": True}]
    finally:
        await runner.cleanup()
    session = toolbox(tokenizer, [tool]).session()  # the server is gone now
    reply = await session.respond("<search>capital</search>")
    assert reply is not None and "error: search failed: Client" in reply.text
    assert session.stats()["tool_errors"] == 1


async def test_python_session_keeps_state_within_an_episode_only(tokenizer):
    box = toolbox(tokenizer, [python_tool(timeout_s=10, session=True)], python_session=True, max_tool_calls=4)
    assert "persist" in box.format.instructions()
    session = box.session()
    first = await session.respond("<code>x = 6\nprint('set')</code>")
    assert first is not None and "set" in first.text
    await session.respond("<code>raise ValueError('boom')</code>")  # a failing cell does not end the session
    second = await session.respond("<code>def f(y): return x * y\nprint(f(7))</code>")
    assert second is not None and "<result>\n42\n</result>" in second.text  # the first cell's print is not repeated
    assert session.stats()["tool_errors"] == 0
    fresh = box.session()  # another episode starts empty
    reply = await fresh.respond("<code>print('x' in globals())</code>")
    assert reply is not None and "False" in reply.text
    session.reset()  # an episode restarted from its prompt starts empty too
    reply = await session.respond("<code>print('x' in globals())</code>")
    assert reply is not None and "False" in reply.text


def test_python_session_needs_the_python_tool():
    assert "needs the python tool" in (check_tools(_domain(tools=[PLUGIN], python_session=True)) or "")
    assert check_tools(_domain(tools=["python"], python_session=True)) is None


async def test_python_session_does_not_replay_a_cell_that_timed_out(tokenizer):
    box = toolbox(tokenizer, [python_tool(timeout_s=1, session=True)], python_session=True, timeout_s=1)
    session = box.session()
    await session.respond("<code>y = 2</code>")
    reply = await session.respond("<code>while True: pass</code>")
    assert reply is not None and "timed out" in reply.text
    reply = await session.respond("<code>print(y + 1)</code>")
    assert reply is not None and "<result>\n3\n</result>" in reply.text


def test_tags_format_runs_search_from_a_python_block_when_python_is_off():
    fmt = TagsFormat({"search": fake_tool("search", None, "query")})
    assert fmt.stop == ["</search>", "```\n"]
    assert fmt.parse('```python\nprint(search("Mira Dovel"))\n```\n') == ToolCall("search", {"query": "Mira Dovel"})
    assert fmt.parse("```py\nsearch(query='mayor of Quelm')\n```\n") == ToolCall("search", {"query": "mayor of Quelm"})
    assert fmt.parse("```\n") == Unfinished()
    assert isinstance(fmt.parse("```python\nprint(6 * 7)\n```\n"), Malformed)
    assert isinstance(fmt.parse("```python\nsearch(x\n```\n"), Malformed)
    assert 'search("query") in a ```python block' in fmt.instructions()
    both = TagsFormat({"python": fake_tool("python", None, "code"), "search": fake_tool("search", None, "query")})
    assert both.parse('```python\nsearch("x")\n```\n') == ToolCall("python", {"code": 'search("x")'})
