"""Multi-turn episodes on a scripted engine: token in, token out over turns, masks, limits,
malformed calls, timeouts, and an abort in the middle of a turn."""

from __future__ import annotations

import asyncio

from rlvr.rollout.base import SamplingParams
from rlvr.rollout.episode import run_episode
from tests.unit.tools.conftest import ScriptedEngine, fake_tool, toolbox

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=50, seed=7)


async def _echo_python(code: str) -> str:
    return f"ran {len(code)} chars\n"


async def _add(a: str, b: str) -> str:
    return str(int(a) + int(b))


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


async def _episode(tokenizer, script, *, tools=None, partial=True, **box):
    engine = ScriptedEngine(tokenizer, script)
    box = toolbox(tokenizer, tools or [fake_tool("python", _echo_python, "code")], **box)
    prompt = _ids(tokenizer, "user: go\nassistant: ")
    completion = await run_episode(engine, prompt_ids=prompt, params=PARAMS, partial=partial, tools=box.session())
    return engine, prompt, completion, box


def _check_prefix_property(engine, prompt, completion) -> None:
    """Every request's input is exactly the previous request's input plus the ids appended since."""
    full = prompt + completion.token_ids
    for before, after in zip(engine.inputs, engine.inputs[1:], strict=False):
        assert after[: len(before)] == before
    for sent in engine.inputs:
        assert sent == full[: len(sent)]


async def test_turns_are_token_in_token_out_and_tool_tokens_are_masked(tokenizer):
    script = ["Let me compute. <code>print(6*7)</code> trailing", "Then <code>x=1</code>", "The answer is 42."]
    engine, prompt, c, box = await _episode(tokenizer, script)
    assert len(engine.inputs) == 3
    _check_prefix_property(engine, prompt, c)
    answer = box.format.render("ran 10 chars\n")
    turn1 = _ids(tokenizer, "Let me compute. <code>print(6*7)</code>")  # the engine stopped on </code>
    tool1 = _ids(tokenizer, answer)
    assert c.token_ids[: len(turn1) + len(tool1)] == turn1 + tool1
    assert engine.inputs[1] == prompt + turn1 + tool1  # turn 2's input: turn 1's ids plus the tool's
    assert len(c.loss_mask) == len(c.token_ids) == len(c.logprobs) == len(c.token_versions)
    tool_positions = [i for i, m in enumerate(c.loss_mask) if m == 0]
    assert set(c.loss_mask) == {0, 1}
    assert all(c.logprobs[i] == 0.0 for i in tool_positions)
    assert all(c.logprobs[i] < 0 for i, m in enumerate(c.loss_mask) if m == 1)
    assert len(tool_positions) == len(tool1) + len(_ids(tokenizer, box.format.render("ran 3 chars\n")))
    assert c.tool_stats == {"turns": 3.0, "tool_calls": 2.0, "tool_errors": 0.0, "tool_timeouts": 0.0,
                            "tool_seconds": c.tool_stats["tool_seconds"]}  # fmt: skip
    assert "<result>\nran 10 chars\n</result>" in c.text and c.text.endswith("The answer is 42.")
    assert c.finish_reason == "stop"


async def test_hermes_without_a_chat_template_is_answered_as_the_qwen_tool_role():
    from rlvr.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    call = '<tool_call>\n{"name": "add", "arguments": {"a": "2", "b": "3"}}\n</tool_call>'
    engine, prompt, c, box = await _episode(
        tokenizer, [f"Adding. {call}", "It is 5."], tools=[fake_tool("add", _add, "a", "b")], tool_format="hermes"
    )
    _check_prefix_property(engine, prompt, c)
    assert "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" in c.text
    assert c.text.endswith("<|im_start|>assistant\nIt is 5.")
    assert c.tool_stats["tool_calls"] == 1 and c.tool_stats["tool_errors"] == 0


async def test_malformed_calls_get_an_error_answer_and_are_counted(tokenizer):
    add = fake_tool("add", _add, "a", "b")
    script = [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "mul", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": "1"}}</tool_call>',
        "giving up",
    ]
    engine, prompt, c, _ = await _episode(
        tokenizer, script, tools=[add], tool_format="hermes", max_tool_calls=5, max_tokens=2000
    )
    _check_prefix_property(engine, prompt, c)
    assert "error: the tool call is not valid JSON" in c.text
    assert "error: unknown tool 'mul'" in c.text
    assert "error: add: missing argument(s) ['b']" in c.text
    assert c.tool_stats["tool_calls"] == 3 and c.tool_stats["tool_errors"] == 3
    assert c.text.endswith("giving up")


async def test_a_raising_tool_is_an_error_answer(tokenizer):
    async def broken(code: str) -> str:
        raise RuntimeError("disk on fire")

    _, _, c, _ = await _episode(tokenizer, ["<code>1</code>", "ok"], tools=[fake_tool("python", broken, "code")])
    assert "error: python failed: RuntimeError: disk on fire" in c.text and c.tool_stats["tool_errors"] == 1


async def test_tool_call_limit_answers_with_an_error(tokenizer):
    script = ["<code>a</code>", "<code>b</code>", "done"]
    _, _, c, _ = await _episode(tokenizer, script, max_tool_calls=1)
    assert c.text.count("ran 1 chars") == 1 and "error: tool call limit (1) reached" in c.text
    assert c.tool_stats["tool_calls"] == 2 and c.tool_stats["tool_errors"] == 1


async def test_max_turns_ends_the_episode_without_running_the_last_call(tokenizer):
    script = ["<code>a</code>", "<code>b</code>", "never asked"]
    engine, _, c, _ = await _episode(tokenizer, script, max_turns=2)
    assert len(engine.inputs) == 2 and c.tool_stats["turns"] == 2 and c.tool_stats["tool_calls"] == 1
    assert c.text.endswith("<code>b</code>") and c.loss_mask[-1] == 1


async def test_token_budget_cuts_tool_output_and_ends_the_episode(tokenizer):
    async def chatty(code: str) -> str:
        return "x" * 500

    engine, prompt, c, _ = await _episode(
        tokenizer, ["<code>a</code>", "never"], tools=[fake_tool("python", chatty, "code")], max_tokens=60
    )
    assert len(c.token_ids) == 60 and c.finish_reason == "length" and len(engine.inputs) == 1
    assert c.loss_mask[-1] == 0


async def test_token_budget_limits_generation(tokenizer):
    _, _, c, _ = await _episode(tokenizer, ["<code>a</code>", "y" * 200], max_tokens=120)
    assert len(c.token_ids) == 120 and c.finish_reason == "length" and c.loss_mask[-1] == 1


async def test_a_tool_timing_out_is_answered_and_counted(tokenizer):
    async def slow(code: str) -> str:
        await asyncio.sleep(30)
        return "late"

    _, _, c, _ = await _episode(
        tokenizer, ["<code>a</code>", "ok"], tools=[fake_tool("python", slow, "code")], timeout_s=0.05
    )
    assert "error: python timed out after 0.05s" in c.text
    assert c.tool_stats["tool_timeouts"] == 1 and c.text.endswith("ok")


async def test_abort_mid_turn_continues_the_turn_and_its_call(tokenizer):
    script = ["Think <co", ("abort", "de>print("), "1)</code>", ("abort", "The ans"), "wer is 1."]
    engine = ScriptedEngine(tokenizer, script)
    box = toolbox(tokenizer, [fake_tool("python", _echo_python, "code")])
    prompt = _ids(tokenizer, "q: ")
    versions = iter([0, 0, 1, 1, 2])

    async def ready() -> None:
        engine.version = next(versions)

    # "Think <co" ends with EOS in the script; make it an abort instead so the turn continues.
    engine.script[0] = ("abort", "Think <co")
    c = await run_episode(
        engine, prompt_ids=prompt, params=PARAMS, partial=True, tools=box.session(), weights_ready=ready
    )
    _check_prefix_property(engine, prompt, c)
    assert "Think <code>print(1)</code>\n<result>\nran 8 chars\n</result>\nThe answer is 1." in c.text
    assert c.tool_stats["tool_calls"] == 1 and c.tool_stats["turns"] == 2
    assert c.oldest_version == 0 and c.policy_version == 2 and set(c.token_versions) == {0, 1, 2}
    seeds = [PARAMS.seed + 1_000_003 * i for i in range(5)]  # every request its own seed
    assert len(set(seeds)) == len(engine.inputs) == 5


async def test_abort_without_partial_restarts_the_whole_episode(tokenizer):
    script = ["<code>a</code>", ("abort", "The"), "<code>b</code>", "fresh"]
    engine, prompt, c, _ = await _episode(tokenizer, script, partial=False)
    assert engine.inputs[2] == prompt  # back to the prompt after the abort
    assert c.tool_stats["tool_calls"] == 1 and c.text.count("<result>") == 1 and c.text.endswith("fresh")


async def test_an_opened_fence_keeps_the_turn_going(tokenizer):
    script = ["Try:\n```\n", "print(2)\n```\n", "two"]
    engine, prompt, c, _ = await _episode(tokenizer, script)
    _check_prefix_property(engine, prompt, c)
    assert c.tool_stats["tool_calls"] == 1 and c.tool_stats["turns"] == 2
    assert "```\nprint(2)\n```\n\n<result>\nran 8 chars\n</result>\ntwo" in c.text


async def test_eos_after_an_opened_fence_ends_the_episode(tokenizer):
    """The turn opens a fence and ends on EOS (no stop string): the model is done. The old code read
    the open fence as an unfinished call and sampled a next turn past the EOS, with loss mask 1."""
    engine, _, c, _ = await _episode(tokenizer, ["Let me try:\n```python", "print(1)\n```\n", "never"])
    assert len(engine.inputs) == 1 and c.finish_reason == "stop"
    assert c.token_ids[-1] == tokenizer.eos_token_id  # nothing after the EOS, so nothing past it is trained
    assert c.loss_mask == [1] * len(c.token_ids) and c.tool_stats["tool_calls"] == 0


async def test_a_closing_fence_right_before_eos_runs_the_call_and_cuts_the_eos(tokenizer):
    """```` ``` ```` then EOS (SmolLM2's habit): no stop string ends a fence without its newline, but the
    turn ends on a whole call. The call runs, and the EOS is cut as a stop string would have ended the
    turn there: the model is never trained to stop before a result it then reads."""
    script = ["Let me try:\n```python\nprint(1)\n```", "The answer is 1."]
    engine, prompt, c, box = await _episode(tokenizer, script)
    _check_prefix_property(engine, prompt, c)
    turn = _ids(tokenizer, "Let me try:\n```python\nprint(1)\n```")
    tool = _ids(tokenizer, box.format.render("ran 8 chars\n"))
    assert c.token_ids[: len(turn) + len(tool)] == turn + tool and engine.inputs[1] == prompt + turn + tool
    assert c.tool_stats["tool_calls"] == 1 and c.tool_stats["turns"] == 2 and c.text.endswith("The answer is 1.")
    assert c.loss_mask == [1] * len(turn) + [0] * len(tool) + [1] * (len(c.token_ids) - len(turn) - len(tool))


async def test_eos_after_a_quoted_call_ends_the_episode(tokenizer):
    """A turn that ends on EOS never runs a call, even one its text holds (here an unclosed <code>)."""
    engine, _, c, _ = await _episode(tokenizer, ["I would write <code>print(1)", "never"])
    assert len(engine.inputs) == 1 and c.tool_stats["tool_calls"] == 0 and c.tool_stats["turns"] == 1


async def test_a_call_straddling_an_abort_runs_and_nothing_past_it_is_kept(tokenizer):
    """`</code>` is split by an abort: the continuation's own text never holds it, so its engine runs
    on (here to EOS). The episode finds the stop string in the turn's text, cuts the turn right after
    it (the same ids an uninterrupted turn has) and runs the call."""
    script = [("abort", "Think <code>print(1)</co"), "de> and rambling on past the call", "The answer is 1."]
    engine, prompt, c, box = await _episode(tokenizer, script)
    _check_prefix_property(engine, prompt, c)
    turn = _ids(tokenizer, "Think <code>print(1)</code>")
    tool = _ids(tokenizer, box.format.render("ran 8 chars\n"))
    assert c.token_ids[: len(turn) + len(tool)] == turn + tool and engine.inputs[2] == prompt + turn + tool
    assert "rambling" not in c.text and c.text.endswith("</result>\nThe answer is 1.")
    assert c.tool_stats["tool_calls"] == 1 and c.tool_stats["turns"] == 2 and c.finish_reason == "stop"
    assert len(c.token_ids) == len(c.logprobs) == len(c.token_versions) == len(c.loss_mask)


async def test_without_a_call_the_episode_is_one_turn(tokenizer):
    engine, _, c, _ = await _episode(tokenizer, ["just an answer"])
    assert len(engine.inputs) == 1 and c.tool_stats["turns"] == 1 and set(c.loss_mask) == {1}


async def _print_42(code: str) -> str:
    return "42\n"


async def _print_tagged(code: str) -> str:
    return "<answer>42</answer>\n"


async def test_rewards_judge_what_the_model_wrote_not_what_the_tool_printed(tokenizer):
    """A tool's output is the tool's: the episode keeps the model's own turns apart (`own_text`) and
    the rewards read only them, so a program that prints the answer is no answer until the model
    states it (a policy had learned to write garbage after a python result that was scored)."""
    from rlvr.rewards.math_rule import score
    from rlvr.rewards.qa_match import score as qa_score
    from rlvr.types import Sample

    tools = [fake_tool("python", _print_42, "code")]
    sample = Sample(id="s", tag="t", messages=[], ground_truth="42")
    _, _, silent, _ = await _episode(tokenizer, ["<code>print(6*7)</code>", "The answer is \\xe."], tools=tools)
    assert "<result>\n42\n</result>" in silent.text and "42" not in (silent.own_text or "42")
    assert silent.own_text == "<code>print(6*7)</code>\nThe answer is \\xe."
    assert (await score(sample, silent)).score == 0.0
    tagged = [fake_tool("python", _print_tagged, "code")]  # the program prints the answer tag itself
    _, _, injected, _ = await _episode(tokenizer, ["<code>print(tag)</code>", "Done."], tools=tagged)
    assert "<answer>42</answer>" in injected.text and (await qa_score(sample, injected)).score == 0.0
    _, _, stated, _ = await _episode(tokenizer, ["<code>print(6*7)</code>", "The answer is 42."], tools=tools)
    assert (await score(sample, stated)).score == 1.0
