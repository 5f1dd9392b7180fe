"""A tool-tuned model's own tool prompt: with `tool_format = "hermes"` and a chat template that lists
tools itself (Qwen2.5/Qwen3 render the `tools` argument into the system message), the prompt is what
that template renders for the tools' schemas, not rlvr's own instructions; a template that does not
list tools (SmolLM2's, Llama 3's shape here) keeps rlvr's instructions in the system message."""

from __future__ import annotations

import json

import pytest

from rlvr.data.chat import encode_prompt, render_prompt
from tests.unit.tools.conftest import fake_tool, toolbox
from tests.unit.tools.test_hermes_template import LLAMA3

# Qwen2.5's shape, shortened: the tools (one JSON object a line) and how to call them in the system
# message, after the row's own system text; a `tool` message as a user turn holding <tool_response>.
QWEN = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n"
    "{% endif %}# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    'Call one: <tool_call>{"name": <name>, "arguments": <args>}</tool_call><|im_end|>\n'
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n{% elif m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Price of 2 pears?"}]


async def _price(item: str, quantity: str) -> str:
    return "10"


def _box(template: str | None, **options):
    from rlvr.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    return toolbox(tokenizer, [fake_tool("price", _price, "item", "quantity")], tool_format="hermes", **options)


def test_a_template_that_lists_tools_gets_their_schemas_as_its_tools_argument():
    box = _box(QWEN)
    tokenizer = box.tokenizer
    schema = box.tools["price"].schema()
    text = render_prompt(box.prompt_messages(ASK), tokenizer=tokenizer)
    # Exactly what the template renders for these tools (a Qwen model's tuned tool prompt) ...
    assert text == tokenizer.apply_chat_template(ASK, tools=[schema], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n# Tools\n<tools>") and json.dumps(schema) in text
    assert box.format.instructions() not in text and "You may call functions" not in text  # ... and nothing of rlvr's
    ids = encode_prompt(box.prompt_messages(ASK), tokenizer=tokenizer)  # what the rollout sends
    assert ids == list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("template", [LLAMA3, None], ids=["llama3", "no-template"])
def test_a_template_that_does_not_list_tools_keeps_rlvrs_instructions(template):
    box = _box(template)
    messages = box.prompt_messages(ASK)
    assert messages[0] == {"role": "system", "content": f"Be brief.\n\n{box.format.instructions()}"}
    assert '"name": "price"' in render_prompt(messages, tokenizer=box.tokenizer)


def test_tool_instructions_off_lists_no_tools_even_where_the_template_could():
    box = _box(QWEN, instructions=False)
    text = render_prompt(box.prompt_messages(ASK), tokenizer=box.tokenizer)
    assert text == box.tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False)
    assert "# Tools" not in text


def test_the_rollouts_prompt_and_its_logged_text_carry_the_templates_tool_list():
    """Through the rollout's PromptCache (ids sent to the engine, text in the samples log)."""
    from rlvr.collect.prompts import PromptCache
    from rlvr.types import Sample
    from tests.unit.loop.test_rollout_manager import recipe

    box = _box(QWEN)
    cache = PromptCache(recipe(), tokenizer=box.tokenizer, toolboxes={"mixed": box}, eval_rows=0)
    sample = Sample(id="p", tag="mixed", domain="mixed", messages=ASK)
    text = box.tokenizer.apply_chat_template(ASK, tools=[box.tools["price"].schema()], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
    assert cache.prompt_text(sample) == text
    assert cache.prompt_ids(sample) == list(box.tokenizer(text, add_special_tokens=False)["input_ids"])
