"""Reward names -> callables, with lazy built-ins and `package.module:function` plug-ins.

Built-ins are listed in `_BUILTINS` as `name -> ("module:attr", one-line doc)`, so `rlvr rewards
list` and `rlvr validate` answer without importing math_verify (sympy), aiohttp or the E2B SDK;
the module is imported on first `get_reward`, and `@register` keeps the table and the modules in
agreement. Every callable returned has the contract's async signature (a sync plug-in runs in a
thread, so a slow one cannot stall the event loop). Built-ins and plug-ins alike are loaded by
`rlvr.plugins`, which says where plug-ins are imported from (docs/rewards.md).
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import inspect
from typing import Any

from rlvr.plugins import PluginError, import_plugin_module, load_plugin
from rlvr.rewards.base import RewardFn, coerce_result

_BUILTINS: dict[str, tuple[str, str]] = {
    "math_rule": (
        "rlvr.rewards.math_rule:score",
        "Extract the final answer (\\boxed{}, 'the answer is', last number) and check it with math-verify.",
    ),
    "code_sandbox": (
        "rlvr.rewards.code_sandbox:score",
        "Run the program in the fenced Python blocks against test cases in a sandbox (local bwrap or E2B).",
    ),
    "llm_judge": (
        "rlvr.rewards.llm_judge:score",
        "Ask an OpenAI-compatible judge model: YES/NO against the reference or a 0-10 rubric.",
    ),
    "qa_match": (
        "rlvr.rewards.qa_match:score",
        "Normalised exact match / token F1 of the answer against ground_truth (a string or aliases).",
    ),
    "gym": (
        "rlvr.rewards.gym:score",
        "Score the <answer> with the reasoning-gym dataset's own score_answer (rows from a gym table).",
    ),
    "verifiers": (
        "rlvr.rewards.verifiers_env:score",
        "Score with the verifiers taskset's own rewards (rows from a verifiers table).",
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

    Raises KeyError (unknown name, listing the known ones) or `rlvr.plugins.PluginError`, an
    ImportError (plug-in that does not load), with a message fit for a user.
    """
    if is_plugin(name):
        return _normalise(load_plugin(name), origin=name)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTINS:
        target = _BUILTINS[name][0]
        import_plugin_module(
            target.partition(":")[0], ref=name, kind="built-in reward"
        )  # its @register fills _REGISTERED
        if name not in _REGISTERED:  # a module that forgot to register: use the table
            _REGISTERED[name] = _normalise(load_plugin(target, kind="built-in reward"), origin=name)
        return _REGISTERED[name]
    raise KeyError(_unknown(name))


def check_reward_name(name: str) -> str | None:
    """None if `name` resolves to a reward, else the error text (for `rlvr validate`).

    Built-ins are checked by name only (no heavy import). Plug-ins are imported and their
    attribute looked up, so a typo in a module path is caught before any GPU is allocated, and
    their signature must take the sample and the completion positionally, as the pool calls it.
    """
    if not name:
        return "reward is empty; " + _known_hint()
    if not is_plugin(name):
        return None if name in _BUILTINS or name in _REGISTERED else _unknown(name)
    try:
        obj = load_plugin(name)
    except PluginError as exc:
        return str(exc)
    if inspect.isclass(obj):
        if not callable(getattr(obj, "score", None)) and not any("__call__" in k.__dict__ for k in obj.__mro__[:-1]):
            return f"plug-in {name!r} is a class without a score() method"
        needs = _required(_signature(obj), skip=0)
        if needs:
            return f"plug-in {name!r} is a class whose __init__ needs {', '.join(needs)}; rlvr creates it with no arguments"
    elif not callable(obj) and not callable(getattr(obj, "score", None)):
        return f"plug-in {name!r} is a {type(obj).__name__}, not a function or an object with a score() method"
    signature = _plugin_signature(obj)
    if signature is None:
        return None
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_two = len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)
    stuck = [p.name for p in positional[2:] if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if not takes_two or stuck:
        return (
            f"plug-in {name!r} must take (sample, completion) as its first two arguments; its signature is {signature}"
        )
    return None


def check_reward_args(name: str, args: dict[str, Any]) -> str | None:
    """None if the reward accepts every key of `args` (and, for a built-in, its value), else the
    error text. A plug-in is checked against its signature: unless it takes `**kwargs`, each key
    must name one of its keyword parameters, and a parameter without a default needs a key."""
    from rlvr.rewards.args import KNOWN_ARGS, check_arg_values

    known = KNOWN_ARGS.get(name)
    if known is None:
        return _plugin_args_problem(name, args) if is_plugin(name) else None
    unknown = sorted(set(args) - known)
    if not unknown:
        return check_arg_values(name, args)
    return _not_taken(name, unknown, known)


def _not_taken(name: str, unknown: list[str], known: set[str] | frozenset[str]) -> str:
    hints = [
        f"{key!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(key, known, n=1)) else repr(key)
        for key in unknown
    ]
    takes = ", ".join(sorted(known)) if known else "no reward_args"
    return f"{name} does not take {', '.join(hints)}; it takes {takes}"


def _plugin_args_problem(name: str, args: dict[str, Any]) -> str | None:
    try:
        signature = _plugin_signature(load_plugin(name))
    except PluginError:
        return None  # check_reward_name says why
    if signature is None:
        return None
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    call_args = {p.name for p in positional[:2]}  # the sample and the completion
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - call_args
    clash = sorted(set(args) & call_args)
    if clash:
        return f"{name} does not take {clash[0]!r}: it is the name of its sample or completion argument"
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        unknown = sorted(set(args) - keywords)
        if unknown:
            return _not_taken(name, unknown, keywords)
    missing = [key for key in _required(signature, skip=2) if key not in args]
    if missing:
        return f"{name} needs reward_args {', '.join(map(repr, missing))} (no default in its signature)"
    return None


def _required(signature: inspect.Signature | None, *, skip: int) -> list[str]:
    """Parameters after the first `skip` positional ones that have no default."""
    if signature is None:
        return []
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    after = positional[skip:] + [p for p in params if p.kind is p.KEYWORD_ONLY]
    return [p.name for p in after if p.default is p.empty]


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin or C callable Python cannot describe
        return None


def _plugin_signature(obj: Any) -> inspect.Signature | None:
    """The signature `_normalise` ends up calling: the function's, the `score` method's, or
    `__call__`'s (a class without creating it: its `self` is left out)."""
    if not inspect.isclass(obj):
        if not inspect.isfunction(obj) and not inspect.ismethod(obj) and callable(getattr(obj, "score", None)):
            obj = obj.score
        return _signature(obj)
    attr = "score" if callable(getattr(obj, "score", None)) else "__call__"
    signature = _signature(getattr(obj, attr))
    if signature is None or isinstance(inspect.getattr_static(obj, attr), staticmethod | classmethod):
        return signature
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _unknown(name: str) -> str:
    return f"unknown reward {name!r}; " + _known_hint()


def _known_hint() -> str:
    return f"known rewards: {', '.join(builtin_names())}; or a plug-in as 'package.module:function'"


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
