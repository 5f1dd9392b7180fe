"""Text helpers shared by rewards: the part of a response that is judged."""

from __future__ import annotations

from typing import Any


def model_text(completion: Any) -> str:
    """What the model wrote: a tool episode's own turns (`Completion.own_text`, tool answers left
    out), else the whole text. A program's output or a search result is the tool's, not an answer:
    read as one, a policy would learn to let the tool state (or fake) its verdict."""
    own = getattr(completion, "own_text", None)
    text = own if own is not None else completion.text
    return text if isinstance(text, str) else ""


def split_think(text: str) -> tuple[str, bool]:
    """(the part to judge, whether a closed think block preceded it).

    Reasoning inside <think>...</think> often contains tentative answers or draft code, so
    only what follows the last `</think>` counts. Without a closing tag the whole text is
    judged: an unclosed `<think>` is not by itself a failure (ROLL zeroes such responses).
    """
    idx = text.rfind("</think>")
    if idx < 0:
        return text, False
    return text[idx + len("</think>") :], "<think>" in text[:idx]
