"""Reward names -> callables, with lazy built-ins and `package.module:function` plug-ins.

Built-ins are listed in `_BUILTINS` as `name -> ("module:attr", one-line doc)` so that
`builtin_names()`, `rlvr rewards list` and `rlvr validate` answer without importing
math_verify (sympy), aiohttp or the E2B SDK; the module is imported on first `get_reward`.
`@register("name")` adds rewards defined at import time (built-in modules use it too, so the
table and the decorator agree). Every returned callable has the contract's async signature:
sync plug-ins returning a float or RewardResult are wrapped (and run in a thread so a slow one
cannot stall the event loop).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
from typing import Any

from rlvr.rewards.base import RewardFn, coerce_result

_BUILTINS: dict[str, tuple[str, str]] = {
    "math_rule": (
        "rlvr.rewards.math_rule:score",
        "Extract the final answer (\\boxed{}, 'the answer is', last number) and check it with math-verify.",
    ),
    "code_sandbox": (
        "rlvr.rewards.code_sandbox:score",
        "Run the last fenced code block against test cases in a sandbox (local bwrap or E2B).",
    ),
    "llm_judge": (
        "rlvr.rewards.llm_judge:score",
        "Ask an OpenAI-compatible judge model: YES/NO against the reference or a 0-10 rubric.",
    ),
    "qa_match": (
        "rlvr.rewards.qa_match:score",
        "Normalised exact match / token F1 of the answer against ground_truth (a string or aliases).",
    ),
}

_REGISTERED: dict[str, RewardFn] = {}
_DOCS: dict[str, str] = {}


def register(name: str):
    """Decorator: make an async reward function (or Reward class/object) available by `name`."""

    def decorate(obj: Any) -> Any:
        _REGISTERED[name] = _normalise(obj, origin=name)
        _DOCS[name] = _first_line(inspect.getdoc(obj) or "")
        return obj

    return decorate


def builtin_names() -> list[str]:
    """Names of every built-in and registered reward, without importing any reward module."""
    return sorted(set(_BUILTINS) | set(_REGISTERED))


def describe() -> list[tuple[str, str]]:
    """(name, one-line doc) for every known reward, for `rlvr rewards list`; imports nothing."""
    docs = {name: doc for name, (_, doc) in _BUILTINS.items()}
    docs.update({name: doc for name, doc in _DOCS.items() if name not in docs})
    return sorted(docs.items())


def is_plugin(name: str) -> bool:
    return ":" in name


def get_reward(name: str) -> RewardFn:
    """The async reward for a built-in name or a `package.module:function` plug-in.

    Raises KeyError (unknown name, listing the known ones) or ImportError/AttributeError
    (plug-in that does not load) with a message fit for a user.
    """
    if is_plugin(name):
        return _normalise(_load_plugin(name), origin=name)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTINS:
        target = _BUILTINS[name][0]
        module_name, _, _attr = target.partition(":")
        importlib.import_module(module_name)  # its @register fills _REGISTERED
        if name not in _REGISTERED:  # a module that forgot to register: use the table
            _REGISTERED[name] = _normalise(_load_plugin(target), origin=name)
        return _REGISTERED[name]
    raise KeyError(_unknown(name))


def check_reward_name(name: str) -> str | None:
    """None if `name` resolves to a reward, else the error text (for `rlvr validate`).

    Built-ins are checked by name only (no heavy import). Plug-ins are imported and their
    attribute looked up, so a typo in a module path is caught before any GPU is allocated.
    """
    if not name:
        return "reward is empty; " + _known_hint()
    if not is_plugin(name):
        return None if name in _BUILTINS or name in _REGISTERED else _unknown(name)
    try:
        obj = _load_plugin(name)
    except (ImportError, AttributeError, ValueError) as exc:
        return str(exc)
    if not callable(obj) and not callable(getattr(obj, "score", None)):
        return f"plug-in {name!r} is a {type(obj).__name__}, not a function or an object with a score() method"
    return None


def check_reward_args(name: str, args: dict[str, Any]) -> str | None:
    """None if a built-in accepts every key of `args` and its value, else the error text (plug-ins
    take anything)."""
    from rlvr.rewards.args import KNOWN_ARGS, check_arg_values

    known = KNOWN_ARGS.get(name)
    if known is None:
        return None
    unknown = sorted(set(args) - known)
    if not unknown:
        return check_arg_values(name, args)
    import difflib

    hints = [
        f"{key!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(key, known, n=1)) else repr(key)
        for key in unknown
    ]
    return f"{name} does not take {', '.join(hints)}; it takes {', '.join(sorted(known))}"


def _unknown(name: str) -> str:
    return f"unknown reward {name!r}; " + _known_hint()


def _known_hint() -> str:
    return f"known rewards: {', '.join(builtin_names())}; or a plug-in as 'package.module:function'"


def _load_plugin(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"plug-in {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"plug-in {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))[:20]
            raise AttributeError(f"plug-in {spec!r}: module {module_name!r} has no attribute {attr!r} (has: {public})")
        obj = getattr(obj, part)
    return obj


def _normalise(obj: Any, *, origin: str) -> RewardFn:
    """Turn a function, coroutine function, Reward class or object into the async contract."""
    if inspect.isclass(obj):
        obj = obj()
    if not inspect.isfunction(obj) and not inspect.ismethod(obj) and callable(getattr(obj, "score", None)):
        obj = obj.score
    if not callable(obj):
        raise TypeError(f"reward {origin!r} is not callable")
    if inspect.iscoroutinefunction(obj):
        fn = obj

        @functools.wraps(fn)
        async def call_async(sample, completion, **reward_args):
            return coerce_result(await fn(sample, completion, **reward_args))

        return call_async

    sync_fn = obj

    @functools.wraps(sync_fn)
    async def call_sync(sample, completion, **reward_args):
        result = await asyncio.to_thread(sync_fn, sample, completion, **reward_args)
        if inspect.isawaitable(result):  # a sync wrapper that returned a coroutine
            result = await result
        return coerce_result(result)

    return call_sync


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
