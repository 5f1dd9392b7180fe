"""The model folder's tokenizer for start-up checks, loaded in milliseconds and without torch.

`rlvr validate` counts prompt tokens and checks that the tokenizer works, but must not import
transformers (that imports torch: seconds, and a login node may have no GPU stack). So
`FastTokenizer` reads the files transformers reads: `tokenizer.json` through `tokenizers` (the
Rust tokenizer transformers wraps) and the chat template rendered by jinja2 set up as transformers
sets it up. It offers the part of a HF tokenizer that `rlvr.data.chat` calls, so prompts are
rendered by the worker's own code. A folder without `tokenizer.json` is loaded with transformers'
`AutoTokenizer` instead (slower, but rare). docs/data.md has the details.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The special tokens transformers passes to a chat template as variables (`special_tokens_map`)."""

SLOW_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tekken.json")
"""Tokenizer files other than tokenizer.json that transformers can build a tokenizer from."""

EXPECTED_FILES = "tokenizer.json and tokenizer_config.json, or tokenizer.model, or vocab.json and merges.txt"
"""What a tokenizer folder holds, for error messages."""


class TokenizerProblem(Exception):
    """The folder's tokenizer is missing or unusable; `str()` says what is expected."""


class FastTokenizer:
    """`tokenizer.json` plus the chat template and special tokens (see the module docstring)."""

    def __init__(self, core: Any, *, chat_template: str | None, special_tokens: dict[str, str]):
        self.core = core
        self.chat_template = chat_template
        self.special_tokens = special_tokens
        self.eos_token = special_tokens.get("eos_token")

    @classmethod
    def from_folder(cls, folder: str | Path) -> FastTokenizer:
        """TokenizerProblem when `folder/tokenizer.json` is missing or does not load."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerProblem(f"{folder} has no tokenizer (expected {EXPECTED_FILES})")
        try:
            core = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the Rust loader raises plain Exception
            raise TokenizerProblem(f"{path} does not load: {_one_line(exc)}") from None
        config = _read_json(folder / "tokenizer_config.json")
        special = _special_tokens(config) | _special_tokens(_read_json(folder / "special_tokens_map.json"))
        return cls(core, chat_template=_chat_template(folder, config), special_tokens=special)

    def __call__(self, text: str | list[str], add_special_tokens: bool = False) -> dict[str, Any]:
        if isinstance(text, str):
            return {"input_ids": self.core.encode(text, add_special_tokens=add_special_tokens).ids}
        return {"input_ids": self.encode_batch(text, add_special_tokens=add_special_tokens)}

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        """Token ids of many texts at once (the Rust tokenizer spreads them over the cores)."""
        return [e.ids for e in self.core.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool = False, tokenize: bool = False
    ) -> str:
        """The rendered conversation, as transformers' `apply_chat_template(..., tokenize=False)`."""
        if tokenize:
            raise ValueError("FastTokenizer renders text only (tokenize=False)")
        if self.chat_template is None:
            raise ValueError("the tokenizer has no chat template")
        template = compile_template(self.chat_template)
        return template.render(
            messages=[dict(m) for m in messages],
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
        )


def load_tokenizer(folder: str | Path, *, trust_remote_code: bool = False) -> Any:
    """A tokenizer for counting and checking: `FastTokenizer` when the folder has tokenizer.json,
    else transformers' AutoTokenizer (for a folder that has only slow-tokenizer files).
    TokenizerProblem when the folder has no tokenizer files at all or they do not load.

    Cached per folder while its files are unchanged: validate checks the tokenizer, then counts
    prompts with it."""
    folder = Path(folder).resolve()
    if not has_tokenizer_files(folder):
        raise TokenizerProblem(f"{folder} has no tokenizer (expected {EXPECTED_FILES})")
    stamp = tuple(_mtime(path) for path in sorted(folder.iterdir()))
    return _load(str(folder), trust_remote_code, stamp)


def has_tokenizer_files(folder: str | Path) -> bool:
    """Whether the folder holds any file transformers builds a tokenizer from (without one it
    builds an empty tokenizer that encodes every text to [])."""
    return any((Path(folder) / name).is_file() for name in ("tokenizer.json", *SLOW_TOKENIZER_FILES))


@functools.lru_cache(maxsize=4)
def _load(folder: str, trust_remote_code: bool, stamp: tuple[Any, ...]) -> Any:
    if (Path(folder) / "tokenizer.json").is_file():
        return FastTokenizer.from_folder(folder)
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a bad folder
        raise TokenizerProblem(f"the tokenizer in {folder} does not load: {_one_line(exc)}") from None


def _mtime(path: Path) -> tuple[str, int]:
    try:
        return path.name, path.stat().st_mtime_ns
    except OSError:
        return path.name, -1


def eos_problem(tokenizer: Any, folder: str | Path, model_folder: str | Path | None) -> str | None:
    """None when generation can stop: the tokenizer names an eos token, or the model's config.json
    or generation_config.json has an `eos_token_id` (the engines read all three)."""
    if getattr(tokenizer, "eos_token", None):
        return None
    for name in ("generation_config.json", "config.json"):
        for base in {Path(folder), Path(model_folder or folder)}:
            if _read_json(base / name).get("eos_token_id") not in (None, [], ""):
                return None
    return (
        f"the tokenizer in {folder} has no eos token (expected eos_token in tokenizer_config.json, or eos_token_id "
        "in config.json or generation_config.json); a response would never end before max_new_tokens"
    )


@functools.lru_cache(maxsize=8)
def compile_template(source: str) -> Any:
    """A chat template compiled as transformers compiles it (`_compile_jinja_template`)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; here it
        only renders its body (as transformers does unless asked for the mask)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """The default chat template: chat_template.jinja, else tokenizer_config.json's (a string, or a
    list of named templates of which `default` is the one used without tools)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key in SPECIAL_TOKENS:
        value = config.get(key)
        if isinstance(value, dict):  # {"content": "<eos>", "lstrip": false, ...}
            value = value.get("content")
        if isinstance(value, str) and value:
            out[key] = value
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
