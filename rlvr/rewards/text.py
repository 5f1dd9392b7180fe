"""Text helpers shared by rewards: the part of a response that is judged."""

from __future__ import annotations

import re

_FENCE_RE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PY_LANGS = {"", "python", "py", "python3", "py3"}


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


def last_code_block(text: str) -> str | None:
    """The last fenced block tagged python (or untagged); None if there is none or it is unclosed."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE_RE.findall(text)]
    for lang, body in reversed(blocks):
        if lang in _PY_LANGS:
            return body
    return None
