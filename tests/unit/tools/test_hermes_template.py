"""`hermes` answers are rendered by the tokenizer's own chat template, so a multi-turn episode's
text is exactly what the template renders for that conversation (the old code wrote Qwen's ChatML
for every model)."""

from __future__ import annotations

import pytest

from rlvr.rollout.base import SamplingParams
from rlvr.rollout.episode import run_episode
from rlvr.tools.base import ToolConfigError
from rlvr.tools.formats import HermesFormat
from tests.unit.tools.conftest import ScriptedEngine, fake_tool, toolbox

# Llama 3's shape: headers, trimmed content, a `tool` message rendered under the ipython role (one
# newline after a header, not Llama's two: rlvr.tiny's char tokenizer turns "\n\n" into <unk>).
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ 'ipython' if m['role'] == 'tool' else m['role'] }}"
    "<|end_header_id|>\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n{% endif %}"
)
# Gemma's shape: strict user/model alternation, so a `tool` message raises.
GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
CALL = '<tool_call>{"name": "add", "arguments": {"a": "2", "b": "3"}}</tool_call>'


async def _add(a: str, b: str) -> str:
    return str(int(a) + int(b))


def _tokenizer(template: str | None):
    from rlvr.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


async def _conversation(tokenizer) -> tuple[str, str]:
    """(prompt text + the episode's text, the prompt's messages + its turns): model turn, tool, model."""
    user = [{"role": "user", "content": "What is 2+3?"}]
    prompt_text = str(tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False))
    prompt = list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    engine = ScriptedEngine(tokenizer, [f"Adding. {CALL}", "It is 5."])
    box = toolbox(tokenizer, [fake_tool("add", _add, "a", "b")], tool_format="hermes")
    params = SamplingParams(max_new_tokens=50)
    c = await run_episode(engine, prompt_ids=prompt, params=params, partial=True, tools=box.session())  # pyright: ignore[reportArgumentType]
    assert c.tool_stats["tool_calls"] == 1 and c.tool_stats["tool_errors"] == 0 and c.finish_reason == "stop"
    return prompt_text + c.text, prompt_text


@pytest.mark.parametrize(
    ("template", "answer"),
    [
        (LLAMA3, {"role": "tool", "content": "5"}),
        (GEMMA, {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}),
    ],
    ids=["llama3", "gemma"],
)
async def test_hermes_turns_are_what_the_chat_template_renders(template, answer):
    tokenizer = _tokenizer(template)
    seen, _ = await _conversation(tokenizer)
    messages = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": f"Adding. {CALL}"},
        answer,
    ]
    expected = str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)) + "It is 5."
    assert seen == expected
    assert "<|im_start|>" not in seen


def test_hermes_answer_of_a_qwen_style_template_is_its_tool_role():
    qwen = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}"
        "\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fmt = HermesFormat({}, tokenizer=_tokenizer(qwen))
    assert fmt.role == "tool"
    assert (
        fmt.render("\n5\n")
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_hermes_follows_the_recipes_plain_template_and_falls_back_to_chatml_without_one():
    plain = HermesFormat({}, tokenizer=_tokenizer(LLAMA3), chat_template="plain")
    assert plain.render("5") == "\ntool: 5\nassistant: "  # as rlvr.data.chat renders a plain prompt
    chatml = HermesFormat({}, tokenizer=_tokenizer(None))
    assert chatml.render("5").startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n")


def test_a_template_that_renders_no_answer_is_a_tool_config_error():
    silent = "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}{% endif %}{% endfor %}"
    with pytest.raises(ToolConfigError, match="cannot render a tool answer"):
        HermesFormat({}, tokenizer=_tokenizer(silent))
