"""Text helpers shared by rewards: the part of a response that is judged."""

from __future__ import annotations


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
