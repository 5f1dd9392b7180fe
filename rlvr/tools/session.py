"""A domain's toolbox and one episode's session: parse a turn, enforce limits, run, count.

The session is what `run_episode` drives (it implements `rlvr.rollout.episode.ToolSession`).
Nothing a model writes can crash an episode: a malformed call, an unknown tool, bad
arguments, a tool that raises or a call past `max_tool_calls` all get an `error: ...`
answer the model reads (counted in `errors`); a call past `tool_timeout_s` gets a timeout
answer (counted in `timeouts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from rlvr.data.chat import ToolPrompt
from rlvr.rollout.episode import ToolReply
from rlvr.tools.base import Tool, ToolError
from rlvr.tools.formats import Malformed, ToolCall, Unfinished, make_format
from rlvr.tools.python import session_script
from rlvr.tools.registry import build_tools

# The sandbox enforces the python tool's own timeout; this grace covers its start and teardown.
TIMEOUT_GRACE_S = 5.0


class Toolbox:
    """One domain's tools, call format and limits (built once; shared by its episodes)."""

    def __init__(
        self,
        tools: dict[str, Tool],
        *,
        tool_format: str,
        tokenizer: Any,
        max_turns: int,
        max_tool_calls: int,
        timeout_s: float,
        max_tokens: int,
        instructions: bool = True,
        python_session: bool = False,
        chat_template: str = "auto",
    ):
        self.tools = tools
        self.instructions = instructions
        self.python_session = python_session
        self.format = make_format(tool_format, tools, tokenizer=tokenizer, chat_template=chat_template)
        self.tokenizer = tokenizer
        self.max_turns, self.max_tool_calls = max_turns, max_tool_calls
        self.timeout_s, self.max_tokens = timeout_s, max_tokens

    @classmethod
    def for_domain(cls, domain: Any, *, tokenizer: Any, default_tokens: int, chat_template: str = "auto") -> Toolbox:
        """From a DomainConfig (ToolConfigError for a bad tool, corpus or plug-in, or a chat template
        that cannot render a hermes answer). `chat_template`: the recipe's `model.chat_template`."""
        return cls(
            build_tools(domain),
            tool_format=domain.tool_format,
            tokenizer=tokenizer,
            max_turns=domain.max_turns,
            max_tool_calls=domain.max_tool_calls,
            timeout_s=domain.tool_timeout_s,
            max_tokens=domain.max_episode_tokens or default_tokens,
            instructions=domain.tool_instructions,
            python_session=domain.python_session,
            chat_template=chat_template,
        )

    def prompt_messages(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """The prompt with the tools described in its system message (prepended, or added to one);
        unchanged with `tool_instructions = false`. A hermes chat template that lists tools itself
        (Qwen2.5, Qwen3) gets their schemas as its `tools` argument (a `ToolPrompt`): the model sees
        the tool prompt it was tuned with."""
        if not self.instructions:
            return messages
        if getattr(self.format, "lists_tools", False):
            return ToolPrompt(messages, tools=[tool.schema() for tool in self.tools.values()])
        text = self.format.instructions()
        if messages and messages[0].get("role") == "system":
            return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
        return [{"role": "system", "content": text}, *messages]

    def session(self) -> ToolSession:
        return ToolSession(self)


class ToolSession:
    """One episode's calls and counters (see the module docstring)."""

    def __init__(self, box: Toolbox):
        self.box = box
        self.stop = list(box.format.stop)
        self.max_turns, self.max_tokens = box.max_turns, box.max_tokens
        self.reset()

    def reset(self) -> None:
        self.calls, self.errors, self.timeouts, self.seconds = 0, 0, 0, 0.0
        self.cells: list[str] = []  # this episode's python code so far (python_session)

    def decode(self, ids: Sequence[int]) -> str:
        return self.box.tokenizer.decode(list(ids), skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self.box.tokenizer(text, add_special_tokens=False)["input_ids"])

    def stats(self) -> dict[str, float]:
        return {
            "tool_calls": float(self.calls),
            "tool_errors": float(self.errors),
            "tool_timeouts": float(self.timeouts),
            "tool_seconds": self.seconds,
        }

    def ends_with_call(self, text: str) -> bool:
        parsed = self.box.format.parse(text)
        return parsed is not None and not isinstance(parsed, Unfinished)

    async def respond(self, text: str) -> ToolReply | None:
        parsed = self.box.format.parse(text)
        if parsed is None:
            return None
        if isinstance(parsed, Unfinished):
            return ToolReply(more=True)
        self.calls += 1
        if isinstance(parsed, Malformed):
            return self._error(parsed.error)
        if self.calls > self.box.max_tool_calls:
            return self._error(f"tool call limit ({self.box.max_tool_calls}) reached; answer without tools")
        return ToolReply(text=self.box.format.render(await self._run(parsed)))

    async def _run(self, call: ToolCall) -> str:
        tool = self.box.tools[call.name]
        start = time.perf_counter()
        try:
            tool.check_arguments(call.arguments)
            session = call.name == "python" and self.box.python_session
            arguments = {"code": session_script(self.cells, call.arguments["code"])} if session else call.arguments
            limit = self.box.timeout_s + (TIMEOUT_GRACE_S if tool.own_timeout else 0.0)
            async with tool.slots() if tool.slots is not None else contextlib.nullcontext():
                answer = await asyncio.wait_for(tool.fn(**arguments), timeout=limit)  # the clock starts here
            if session:  # a cell that timed out is not replayed (it would time out every later call)
                self.cells.append(call.arguments["code"])
            return answer
        except TimeoutError:
            self.timeouts += 1
            return f"error: {call.name} timed out after {self.box.timeout_s:g}s"
        except ToolError as exc:
            self.errors += 1
            return f"error: {exc}"
        except Exception as exc:  # noqa: BLE001 - a failing tool is an answer, never a crashed episode
            self.errors += 1
            return f"error: {call.name} failed: {type(exc).__name__}: {exc}"
        finally:
            self.seconds += time.perf_counter() - start

    def _error(self, message: str) -> ToolReply:
        self.errors += 1
        return ToolReply(text=self.box.format.render(f"error: {message}"))
