"""A domain's `tools` list -> `Tool`s: the built-ins and `package.module:function` plug-ins.

A plug-in is a plain function (sync or async) taking JSON-able keyword arguments and
returning text. Its JSON schema comes from the signature (annotations -> JSON types,
parameters without a default are required) and the docstring (first paragraph ->
description; `name: text` lines under `Args:` -> parameter descriptions), so the hermes
prompt can list it without any extra declaration. A domain's `tool_schemas` replaces the
description or parameters of any of its tools (the schema a tool-tuned model was trained with).
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable
from typing import Any

from rlvr.plugins import PluginError, load_plugin
from rlvr.tools.base import Tool, ToolConfigError

BUILTIN_TOOLS = {
    "python": "Run Python in the code sandbox (stateless per call); answers with stdout.",
    "search": "BM25 over search_corpus (jsonl passages), or a Search-R1 /retrieve server at search_url.",
}
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def build_tools(domain: Any) -> dict[str, Tool]:
    """The domain's tools by name (a DomainConfig); ToolConfigError for a bad entry."""
    from rlvr.tools.python import python_tool
    from rlvr.tools.search import search_tool

    tools: dict[str, Tool] = {}
    for spec in domain.tools:
        if spec == "python":
            tool = python_tool(timeout_s=domain.tool_timeout_s, session=getattr(domain, "python_session", False))
        elif spec == "search":
            tool = search_tool(
                corpus=domain.search_corpus,
                top_k=domain.search_top_k,
                url=domain.search_url,
                timeout_s=domain.tool_timeout_s,
            )
        elif ":" in spec:
            tool = plugin_tool(spec)
        else:
            raise ToolConfigError(
                f"unknown tool {spec!r}; built-ins: {sorted(BUILTIN_TOOLS)}, or package.module:function"
            )
        if tool.name in tools:
            raise ToolConfigError(f"two tools are named {tool.name!r}")
        tools[tool.name] = tool
    for name, schema in getattr(domain, "tool_schemas", {}).items():  # the recipe's word over the derived one
        tool = tools[name]  # the recipe checks that it names one of these tools
        tool.description = schema.get("description", tool.description)
        tool.parameters = schema.get("parameters", tool.parameters)
    return tools


def check_tools(domain: Any) -> str | None:
    """None if every tool of the domain resolves (for `rlvr validate`), else the error text.

    Plug-ins are imported; the search corpus must exist (its rows are read when the run starts).
    """
    for spec in domain.tools:
        if spec == "search":
            if not domain.search_corpus and not domain.search_url:
                return "the search tool needs search_corpus (a jsonl of passages) or search_url"
        elif spec != "python":
            if ":" not in spec:
                return f"unknown tool {spec!r}; built-ins: {sorted(BUILTIN_TOOLS)}, or package.module:function"
            try:
                plugin_tool(spec)
            except ToolConfigError as exc:
                return str(exc)
    if len(set(domain.tools)) != len(domain.tools):
        return "a tool is listed twice"
    if getattr(domain, "python_session", False) and "python" not in domain.tools:
        return "python_session = true needs the python tool in tools"
    return None


def plugin_tool(spec: str) -> Tool:
    """The tool a `package.module:function` plug-in makes (`rlvr.plugins` loads it), named after
    the function; ToolConfigError for a reference that does not resolve or is not a function."""
    try:
        fn = load_plugin(spec, kind="tool plug-in")
    except PluginError as exc:
        raise ToolConfigError(str(exc)) from None
    attr = spec.partition(":")[2]
    if not callable(fn):
        raise ToolConfigError(f"tool plug-in {spec!r} is a {type(fn).__name__}, not a function")
    description, parameters = schema_of(fn)

    async def call(**arguments: Any) -> str:
        if inspect.iscoroutinefunction(fn):
            result = await fn(**arguments)
        else:
            result = await asyncio.to_thread(fn, **arguments)
        return result if isinstance(result, str) else str(result)

    return Tool(name=attr, description=description, parameters=parameters, fn=call)


def schema_of(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """(description, JSON schema of the arguments) from a function's signature and docstring."""
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    arg_docs = (
        dict(re.findall(r"^\s+(\w+)\s*(?:\([^)]*\))?:\s*(.+)$", doc.split("Args:", 1)[1], re.M))
        if "Args:" in doc
        else {}
    )
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except Exception:  # noqa: BLE001 - an unresolvable annotation only loses its type
        hints = {}
    props: dict[str, Any] = {}
    required = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop: dict[str, Any] = {}
        kind = _JSON_TYPES.get(getattr(hints.get(name), "__origin__", hints.get(name)))  # list[str] -> list
        if kind:
            prop["type"] = kind
        if name in arg_docs:
            prop["description"] = arg_docs[name].strip()
        props[name] = prop
        if param.default is param.empty:
            required.append(name)
    return description, {"type": "object", "properties": props, "required": required}
