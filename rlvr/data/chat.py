"""Turn a Sample's messages into the prompt text and token ids the policy sees.

`auto` uses the tokenizer's own chat template (what the model was tuned with); `plain`
joins `role: content` lines and ends with `assistant: `, for base models and the tiny
test models that have no template.

Special tokens: a chat template renders its own (Gemma's and Llama's write `<bos>` into the
text), so a templated prompt is tokenized without adding any. A plain prompt gets the special
tokens the tokenizer itself puts before a text (`special_prefix`: its BOS when it declares
`add_bos_token`, as Gemma's does; nothing for Qwen, SmolLM2 or the quickstart's model), because a
base model that was trained on `<bos>`-led text writes garbage without it. Every place that
encodes or counts a prompt goes through `encode_prompt` / `prompt_specials`, so the rollout, eval
and `rlvr validate`'s length counts agree.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

PROBE = "a"
"""A text every tokenizer encodes to something: where its ids start in the special-token encoding
tells the prefix apart from a suffix."""

_prefixes: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()


class ToolPrompt(list):
    """Chat messages plus the function schemas their chat template lists itself (its `tools` argument,
    which Qwen2.5's and Qwen3's render into the system message as they were tuned on). What
    `Toolbox.prompt_messages` returns for such a template: the schemas travel with the messages, so
    every place that renders a tool domain's prompt (rollout, eval, `rlvr validate`'s length counts)
    renders the same text."""

    def __init__(self, messages: list[dict[str, str]], *, tools: list[dict[str, Any]]):
        super().__init__(messages)
        self.tools = tools


def uses_chat_template(tokenizer: Any, template: str = "auto") -> bool:
    """Whether `render_prompt` renders with the tokenizer's chat template (else `plain` lines)."""
    return template == "auto" and tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def render_prompt(messages: list[dict[str, str]], *, tokenizer: Any = None, template: str = "auto") -> str:
    """The prompt text, ending where the assistant's answer starts (with a `ToolPrompt`'s tools)."""
    if uses_chat_template(tokenizer, template):
        tools = {"tools": messages.tools} if isinstance(messages, ToolPrompt) else {}
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **tools)
    if template not in ("auto", "plain"):
        raise ValueError(f"chat_template must be 'auto' or 'plain', got {template!r}")
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nassistant: "


def special_prefix(tokenizer: Any) -> tuple[int, ...]:
    """The special-token ids the tokenizer puts before a text when it adds special tokens (its BOS
    for Gemma and Llama, none for Qwen). Ids it would append (an EOS, for `add_eos_token`) are
    left out: a prompt is continued, not ended. Cached per tokenizer object."""
    try:
        return _prefixes[tokenizer]
    except (KeyError, TypeError):
        pass
    bare = list(tokenizer(PROBE, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(PROBE, add_special_tokens=True)["input_ids"])
    starts = [i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare]
    prefix = tuple(full[: starts[0]]) if starts and bare else ()
    with contextlib.suppress(TypeError):  # not weak-referenceable: computed again (two tiny encodes)
        _prefixes[tokenizer] = prefix
    return prefix


def prompt_specials(tokenizer: Any, template: str = "auto") -> tuple[int, ...]:
    """The ids `encode_prompt` puts before the rendered text's own: none after a chat template,
    `special_prefix` for a plain prompt."""
    return () if uses_chat_template(tokenizer, template) else special_prefix(tokenizer)


def encode_prompt(messages: list[dict[str, str]], *, tokenizer: Any, template: str = "auto") -> list[int]:
    """Token ids of the rendered prompt: a chat template's text as it is (no special token added
    twice), a plain prompt led by the tokenizer's own BOS if it adds one (see the module docstring)."""
    text = render_prompt(messages, tokenizer=tokenizer, template=template)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return [*prompt_specials(tokenizer, template), *ids]
