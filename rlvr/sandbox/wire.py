"""By-value codec between the judge and the solution process (stdlib only; copied into both sandboxes).

Only exact builtin types cross: None, bool, int, float, str, bytes, complex, list, tuple,
dict, set, frozenset. A subclass (an `int` whose `__eq__` always answers True) is refused,
so nothing the solution builds can run code in the judge. Non-JSON types are tagged as
one-key objects; the decoder accepts only those tags and rebuilds plain builtins.
"""

import json
import math

MAX_DEPTH = 200


class NotPlain(TypeError):
    """A value that cannot cross by value; its message names the type."""


def encode(value, depth=0):
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {kind.__name__: [encode(v, depth + 1) for v in value]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [encode(value.real), encode(value.imag)]}
    raise NotPlain(f"a {kind.__module__}.{kind.__qualname__} object is not a plain value")


def _float(text):
    if text not in ("nan", "inf", "-inf"):
        raise NotPlain(f"bad float tag {text!r}")
    return float(text)


_TAGS = {
    "float": _float,
    "tuple": lambda items: tuple(decode(v) for v in _list(items)),
    "dict": lambda pairs: {decode(k): decode(v) for k, v in (_pair(p) for p in _list(pairs))},
    "set": lambda items: {decode(v) for v in _list(items)},
    "frozenset": lambda items: frozenset(decode(v) for v in _list(items)),
    "bytes": lambda text: bytes.fromhex(text),
    "complex": lambda parts: complex(*(_real(p) for p in _list(parts))),
}


def _list(value):
    if type(value) is not list:
        raise NotPlain("malformed value")
    return value


def _pair(value):
    if type(value) is not list or len(value) != 2:
        raise NotPlain("malformed dict entry")
    return value


def _real(value):
    value = decode(value)
    if type(value) not in (int, float):
        raise NotPlain("malformed complex")
    return value


def decode(value):
    """Rebuild a plain value from its JSON form; NotPlain for anything malformed."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [decode(v) for v in value]
    if kind is dict and len(value) == 1:
        tag, body = next(iter(value.items()))
        if tag in _TAGS:
            try:
                return _TAGS[tag](body)
            except NotPlain:
                raise
            except (TypeError, ValueError) as exc:
                raise NotPlain(f"malformed {tag}: {exc}") from None
    raise NotPlain("malformed value")


def dumps(message):
    return json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n"


def loads(line):
    return json.loads(line)
