"""Turn a Sample's messages into the prompt text and token ids the policy sees.

`auto` uses the tokenizer's own chat template (what the model was tuned with); `plain`
joins `role: content` lines and ends with `assistant: `, for base models and the tiny
test models that have no template.
"""

from __future__ import annotations

from typing import Any


def render_prompt(messages: list[dict[str, str]], *, tokenizer: Any = None, template: str = "auto") -> str:
    """The prompt text, ending where the assistant's answer starts."""
    if template == "auto" and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if template not in ("auto", "plain"):
        raise ValueError(f"chat_template must be 'auto' or 'plain', got {template!r}")
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nassistant: "


def encode_prompt(messages: list[dict[str, str]], *, tokenizer: Any, template: str = "auto") -> list[int]:
    """Token ids of the rendered prompt (no special tokens added twice)."""
    text = render_prompt(messages, tokenizer=tokenizer, template=template)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
