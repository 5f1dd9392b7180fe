"""What a tool is: a name, a JSON schema for its arguments, and an async function returning text."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any


class ToolError(Exception):
    """A call the tool refuses (bad arguments, a failing program): its message is the answer."""


class ToolConfigError(ValueError):
    """A tool that cannot be set up (unknown name, bad plug-in, missing corpus): a recipe error."""


@dataclass(slots=True)
class Tool:
    """`await fn(**arguments)` returns the text the model reads; `parameters` is a JSON schema object.

    `own_timeout`: the tool stops itself at the timeout (the sandbox kills the program and the
    tool raises TimeoutError), so the session only adds a grace period for start and teardown.
    `slots`: the semaphore a call holds while it runs (a machine-wide cap, e.g. sandboxes per
    core); the session takes it *before* the call's timeout starts, so a call that queues
    behind other episodes' calls is not answered "timed out".
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Awaitable[str]]
    own_timeout: bool = False
    slots: Callable[[], asyncio.Semaphore] | None = None

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Qwen function schema (what a hermes prompt lists)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """ToolError naming what is missing or unknown (the model reads it and can retry)."""
        props = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        unknown = [k for k in arguments if k not in props]
        if missing:
            raise ToolError(f"{self.name}: missing argument(s) {missing}")
        if unknown:
            raise ToolError(f"{self.name}: unknown argument(s) {unknown}; takes {sorted(props)}")
