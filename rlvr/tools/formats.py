"""How a tool call looks in the model's text, and how the answer is wrapped: `tags` and `hermes`.

A format gives the stop strings that end a call (so generation pauses right there), parses
the text of the model turn that just stopped, and renders a tool's answer as the text whose
tokens are appended. Only a call that *ends the turn* counts: the engine stopped on it.

- tags (ROLL's agentic style): `<code>...</code>` or a fenced python block for `python`,
  `<search>...</search>` for `search` (or, without `python`, a fenced python block that calls
  `search("query")`: a form small instruct models write where they write no tag), `<NAME>...</NAME>` for a plug-in (a JSON object of
  arguments, or plain text for its first parameter); answers in `<result>...</result>`.
- hermes (Qwen2.5/Qwen3, verl): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, or a
  list holding one call (`<tool_call>[{...}]</tool_call>`: SmolLM2's form, from APIGen's data);
  the answer closes the assistant message, adds a `tool` message and opens a new assistant
  turn, all as the model's own chat template renders them (see `HermesFormat`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlvr.data.chat import render_prompt
from rlvr.tools.base import Tool, ToolConfigError

MAX_ANSWER_CHARS = 4000  # a tool answer longer than this is cut (the rest is noise for the policy)


@dataclass(slots=True, frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(slots=True, frozen=True)
class Malformed:
    """A call the model got wrong; `error` is what the model reads back."""

    error: str


@dataclass(slots=True, frozen=True)
class Unfinished:
    """The turn stopped inside a call that is not closed yet (an opening fence): keep generating."""


Parsed = ToolCall | Malformed | Unfinished | None

_FENCE_RE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PY_LANGS = {"", "python", "py", "python3", "py3"}
_TAG_OF = {"python": "code"}


def clip(text: str) -> str:
    """The answer without surrounding newlines (the wrapper adds its own), cut at MAX_ANSWER_CHARS."""
    text = text.strip("\n")
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    return text[:MAX_ANSWER_CHARS] + f"\n... ({len(text) - MAX_ANSWER_CHARS} more characters cut)"


# Markers for rendering a hermes answer with a chat template (plain words: templates may trim).
_TURN = "RLVR_ASSISTANT_TURN_8c1f"
_PROBE = "RLVR_TOOL_ANSWER_8c1f"

# A BPE token can carry a few characters past the stop string that ended the turn ("</code>.").
TRAILING_SLACK = 4


def _ends_turn(text: str, end: int) -> bool:
    """Whether a call ending at `end` is what stopped the turn (not one quoted earlier in it)."""
    rest = text[end:].strip()
    return len(rest) <= TRAILING_SLACK and "\n" not in rest


def search_query(code: str) -> str | None:
    """The string argument of the first `search(...)` call in `code` (e.g. `print(search("x"))`),
    found by parsing it, not running it: None for code that does not parse or calls no search."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "search":
            args = list(node.args) + [k.value for k in node.keywords if k.arg == "query"]
            if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                return args[0].value
    return None


def _lists_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a tool schema passed as `tools` (a probe's name shows)."""
    probe = {"type": "function", "function": {"name": _PROBE, "description": "", "parameters": {}}}
    messages = [{"role": "user", "content": "Hi"}]
    try:
        text = tokenizer.apply_chat_template(messages, tools=[probe], add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot take tools does not list them
        return False
    return _PROBE in text


class TagsFormat:
    name = "tags"

    def __init__(self, tools: Mapping[str, Tool]):
        self.tools = dict(tools)
        self.tags = {_TAG_OF.get(name, name): name for name in tools}
        self.fenced = "python" if "python" in tools else "search" if "search" in tools else None
        self.stop = [f"</{tag}>" for tag in self.tags] + (["```\n"] if self.fenced else [])

    def parse(self, text: str) -> Parsed:
        best: tuple[int, Parsed] | None = None
        for tag, name in self.tags.items():
            for match in re.finditer(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL):
                if best is None or match.end() > best[0]:
                    best = (match.end(), self._call(name, match.group(1)))
        if self.fenced:
            for match in _FENCE_RE.finditer(text):
                if match.group(1).lower() in _PY_LANGS and (best is None or match.end() > best[0]):
                    best = (match.end(), self._fenced_call(match.group(2)))
            if text.count("```") % 2 == 1 and text.rstrip().rsplit("\n", 1)[-1].startswith("```"):
                return Unfinished()  # stopped on the opening fence's "```\n"
        if best is None or not _ends_turn(text, best[0]):
            return None
        return best[1]

    def _fenced_call(self, code: str) -> Parsed:
        """A fenced block runs `python`; without it, the block's `search("query")` call is a search."""
        if self.fenced == "python":
            return self._call("python", code)
        query = search_query(code)
        return Malformed('only search("query") runs here') if query is None else self._call("search", query)

    def _call(self, name: str, body: str) -> Parsed:
        body = body.strip("\n")
        if not body.strip():
            return Malformed(f"empty {name} call")
        if name in ("python", "search"):
            return ToolCall(name, {"code" if name == "python" else "query": body})
        props = list(self.tools[name].parameters.get("properties", {}))
        if body.lstrip().startswith("{"):
            try:
                args = json.loads(body)
            except json.JSONDecodeError as exc:
                return Malformed(f"arguments of {name} are not valid JSON: {exc}")
            return ToolCall(name, args) if isinstance(args, dict) else Malformed(f"arguments of {name}: not an object")
        if not props:
            return Malformed(f"{name} takes no arguments")
        return ToolCall(name, {props[0]: body.strip()})

    def render(self, answer: str) -> str:
        return f"\n<result>\n{clip(answer)}\n</result>\n"

    def instructions(self) -> str:
        lines = ["You can use tools. Write a call and stop; its answer comes back in <result>...</result>."]
        for tag, name in self.tags.items():
            desc = self.tools[name].description
            if name == "python":
                lines.append(f"- <code>python code</code> (or a ```python block): runs it, returns stdout. {desc}")
            elif name == "search":
                alt = "" if "python" in self.tools else ' (or search("query") in a ```python block)'
                lines.append(f"- <search>query</search>{alt}: returns passages. {desc}")
            else:
                lines.append(f"- <{tag}>JSON arguments</{tag}>: {desc}")
        return "\n".join(lines)


class HermesFormat:
    """Hermes-style calls; the answer is rendered by the model's own chat template.

    The model's turn stopped on `</tool_call>`, inside its assistant message. What is appended is
    what the template renders after that message's text, for the conversation (a user message,
    an assistant message, the tool's answer) with the generation prompt: the assistant message's
    end, the answer's turn and the next assistant turn's start. It is found by rendering that
    conversation with a marker as the assistant's text and taking what follows the marker, so it
    is right for any template (ChatML, Llama 3, Gemma, ...), whatever it puts before. The answer
    is a `tool` message; a template that rejects that role (or drops its content) gets a `user`
    message holding `<tool_response>...</tool_response>` instead. `chat_template = "plain"` (the
    recipe's `model.chat_template`) renders it as the prompt is rendered then: `tool: ...` lines.
    Only a tokenizer with no chat template at all gets Qwen's ChatML markup hard-coded below.

    `lists_tools`: the template renders the function schemas of its `tools` argument itself (Qwen2.5's
    and Qwen3's write them, and how to call them, into the system message): the prompt then lists the
    tools that way (`Toolbox.prompt_messages`), not with `instructions()`.
    """

    name = "hermes"
    stop = ["</tool_call>"]
    _CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def __init__(self, tools: Mapping[str, Tool], *, tokenizer: Any = None, chat_template: str = "auto"):
        self.tools = dict(tools)
        self.plain = chat_template == "plain"
        self.tokenizer = tokenizer if getattr(tokenizer, "chat_template", None) and not self.plain else None
        self.role = "tool"
        self.lists_tools = False
        if self.tokenizer is not None:
            self.role = self._answer_role()
            self.lists_tools = _lists_tools(self.tokenizer)

    def _answer_role(self) -> str:
        """`tool` when the template renders a tool message (with its content), else `user`."""
        problems = []
        for role in ("tool", "user"):
            try:
                if _PROBE in self._rendered(_PROBE, role):
                    return role
                problems.append(f"a {role} message: its content is not rendered")
            except Exception as exc:  # noqa: BLE001 - templates raise anything (jinja's raise_exception)
                problems.append(f"a {role} message: {type(exc).__name__}: {exc}")
        raise ToolConfigError(
            f"tool_format hermes: the tokenizer's chat template cannot render a tool answer ({'; '.join(problems)})"
        )

    def _rendered(self, answer: str, role: str) -> str:
        """The template's text after the assistant turn's own text (see the class docstring)."""
        content = answer if role == "tool" else f"<tool_response>\n{answer}\n</tool_response>"
        messages = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": _TURN},
            {"role": role, "content": content},
        ]
        if self.tokenizer is None:
            text = render_prompt(messages, template="plain")
        else:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        at = text.find(_TURN)
        if at < 0:
            raise ValueError("the assistant message's content is not rendered")
        return text[at + len(_TURN) :]

    def parse(self, text: str) -> Parsed:
        matches = list(self._CALL_RE.finditer(text))
        if not matches or not _ends_turn(text, matches[-1].end()):
            return None
        body = matches[-1].group(1).strip()
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            return Malformed(f"the tool call is not valid JSON: {exc}")
        if isinstance(call, list):  # APIGen's list form, which SmolLM2 was tuned on
            if len(call) != 1:
                return Malformed(f"one tool call per turn, this one holds {len(call)}")
            call = call[0]
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return Malformed('a tool call is {"name": <tool>, "arguments": {...}}')
        name, args = call["name"], call.get("arguments", {})
        if isinstance(args, str):  # some models send the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return Malformed(f"arguments of {name} are not a JSON object")
        if not isinstance(args, dict):
            return Malformed(f"arguments of {name} are not a JSON object")
        if name not in self.tools:
            return Malformed(f"unknown tool {name!r}; tools: {sorted(self.tools)}")
        return ToolCall(name, args)

    def render(self, answer: str) -> str:
        if self.tokenizer is not None or self.plain:
            return self._rendered(clip(answer), self.role)
        return (  # no chat template: Qwen's ChatML, as Qwen2.5/Qwen3's templates render a tool message
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
            f"{clip(answer)}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )

    def instructions(self) -> str:
        schemas = "\n".join(json.dumps(t.schema()) for t in self.tools.values())
        return (
            "# Tools\n\nYou may call functions. Their signatures are inside <tools></tools>:\n"
            f"<tools>\n{schemas}\n</tools>\n\n"
            "To call one, write a JSON object with its name and arguments inside <tool_call></tool_call>:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )


ToolFormat = TagsFormat | HermesFormat


def make_format(
    name: str, tools: Mapping[str, Tool], *, tokenizer: Any = None, chat_template: str = "auto"
) -> ToolFormat:
    """`tokenizer` and `chat_template` (the recipe's `model.chat_template`) shape hermes answers."""
    if name == "hermes":
        return HermesFormat(tools, tokenizer=tokenizer, chat_template=chat_template)
    return TagsFormat(tools)
