from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from rlvr.rewards import registry
from rlvr.rewards.registry import builtin_names, check_reward_name, get_reward
from rlvr.types import RewardResult

from .conftest import make_completion, make_sample


def test_builtin_names_and_commands_import_nothing_heavy():
    code = (
        "import sys, rlvr.rewards.registry as r, rlvr.rewards.commands\n"
        "assert set(r.builtin_names()) >= {'math_rule', 'code_sandbox', 'llm_judge'}, r.builtin_names()\n"
        "assert r.check_reward_name('math_rule') is None\n"
        "heavy = [m for m in ('math_verify', 'sympy', 'e2b', 'e2b_code_interpreter', 'aiohttp', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_name_lists_known_names():
    with pytest.raises(KeyError) as info:
        get_reward("math_rul")
    message = str(info.value)
    for name in ("math_rule", "code_sandbox", "llm_judge", "package.module:function"):
        assert name in message
    assert "math_rul" in (check_reward_name("math_rul") or "")
    assert check_reward_name("code_sandbox") is None


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            from rlvr.types import RewardResult

            def length_float(sample, completion, **kw):
                return float(len(completion.text)) * kw.get("scale", 1.0)

            def as_result(sample, completion):
                return RewardResult(0.25, {"reason": "sync result"})

            async def async_fn(sample, completion, **kw):
                return RewardResult(0.75, {"reason": "async"})

            class Scorer:
                async def score(self, sample, completion, **kw):
                    return 0.5

            def returns_nan(sample, completion):
                return float("nan")

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


async def test_plugins_of_every_shape(plugin_module):
    sample, completion = make_sample(), make_completion("abcd")
    assert (await get_reward(f"{plugin_module}:length_float")(sample, completion, scale=0.5)).score == 2.0
    result = await get_reward(f"{plugin_module}:as_result")(sample, completion)
    assert isinstance(result, RewardResult) and result.score == 0.25
    assert (await get_reward(f"{plugin_module}:async_fn")(sample, completion)).score == 0.75
    assert (await get_reward(f"{plugin_module}:Scorer")(sample, completion)).score == 0.5
    nan = await get_reward(f"{plugin_module}:returns_nan")(sample, completion)
    assert nan.score == 0.0 and "non-finite" in nan.info["reason"]


def test_check_plugin_names(plugin_module):
    assert check_reward_name(f"{plugin_module}:length_float") is None
    assert "no attribute 'nope'" in (check_reward_name(f"{plugin_module}:nope") or "")
    assert "cannot import module" in (check_reward_name("no_such_pkg_xyz.mod:fn") or "")
    assert "not a function" in (check_reward_name(f"{plugin_module}:NOT_CALLABLE") or "")
    assert "package.module:function" in (check_reward_name(":fn") or "")


async def test_register_decorator_adds_a_name():
    @registry.register("test_constant")
    async def constant(sample, completion, **kw):
        """Always 1."""
        return RewardResult(1.0, {})

    try:
        assert "test_constant" in builtin_names()
        assert ("test_constant", "Always 1.") in registry.describe()
        assert (await get_reward("test_constant")(make_sample(), make_completion("x"))).score == 1.0
    finally:
        registry._REGISTERED.pop("test_constant")
        registry._DOCS.pop("test_constant")
