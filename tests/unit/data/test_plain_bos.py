"""A plain prompt gets the BOS its tokenizer adds; a chat template's prompt gets none added twice.

Gemma 3's base model has no chat template, so `chat_template = "auto"` renders it `plain`; its
tokenizer adds `<bos>` (add_bos_token), and without it the model writes garbage. The tokenizers
here are the char-level test tokenizer with a post-processor like Gemma's (`<bos> $A`), read both by
transformers (what the rollout and eval encode with) and by `FastTokenizer` (what `rlvr validate`
counts with): the ids, and the counts, must agree everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlvr.data.chat import encode_prompt, prompt_specials, render_prompt, special_prefix
from rlvr.data.prompt_fit import prompt_example, prompt_lengths
from rlvr.recipe.tokenizer import FastTokenizer, load_tokenizer
from rlvr.tiny import BOS, EOS, build_char_tokenizer
from rlvr.types import Sample

VOCAB: dict[str, int] = build_char_tokenizer().get_vocab()
ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "recipes" / "quickstart" / "policy"
MESSAGES = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1 + 2 ="}]
BOS_TEMPLATE = (  # Gemma's shape: the template writes the BOS itself
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def char_folder(path: Path, *, single: str, template: str | None = None) -> Path:
    """The char tokenizer with post-processor `single` (e.g. "<bos> $A") and an optional template."""
    from tokenizers import processors

    tokenizer = build_char_tokenizer()
    specials = [(tok, VOCAB[tok]) for tok in (BOS, EOS) if tok in single]
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)  # pyright: ignore[reportAttributeAccessIssue]
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if template is not None:
        config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": "<bos>" in single}))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    return path


def both(folder: Path) -> list[Any]:
    """The folder's tokenizer as transformers loads it and as `rlvr validate` loads it."""
    from transformers import AutoTokenizer

    ours = load_tokenizer(folder)
    assert isinstance(ours, FastTokenizer)
    return [AutoTokenizer.from_pretrained(folder), ours]


@pytest.fixture()
def bos_folder(tmp_path: Path) -> Path:
    return char_folder(tmp_path / "bos", single="<bos> $A")


def test_a_plain_prompt_starts_with_the_tokenizers_bos_once(bos_folder: Path) -> None:
    bos = VOCAB[BOS]
    for tokenizer in both(bos_folder):
        text = render_prompt(MESSAGES, tokenizer=tokenizer)  # no template: "auto" falls back to plain
        assert text == "system: Add.\nuser: 1 + 2 =\nassistant: "
        ids = encode_prompt(MESSAGES, tokenizer=tokenizer)
        assert ids == list(tokenizer(text, add_special_tokens=True)["input_ids"])  # what the tokenizer adds
        assert ids[0] == bos and ids.count(bos) == 1
        assert ids[1:] == list(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert encode_prompt(MESSAGES, tokenizer=tokenizer, template="plain") == ids
        assert special_prefix(tokenizer) == (bos,) == prompt_specials(tokenizer, "plain")


def test_a_template_that_renders_the_bos_gets_none_added(tmp_path: Path) -> None:
    folder = char_folder(tmp_path / "tpl", single="<bos> $A", template=BOS_TEMPLATE)
    bos = VOCAB[BOS]
    for tokenizer in both(folder):
        ids = encode_prompt(MESSAGES, tokenizer=tokenizer)
        assert ids[0] == bos and ids.count(bos) == 1, "the template's BOS, not a second one"
        assert prompt_specials(tokenizer, "auto") == ()
        plain = encode_prompt(MESSAGES, tokenizer=tokenizer, template="plain")  # the template asked away
        assert plain[0] == bos and plain.count(bos) == 1


def test_an_appended_eos_is_not_put_on_a_prompt(tmp_path: Path) -> None:
    folder = char_folder(tmp_path / "eos", single="<bos> $A <eos>")
    bos, eos = VOCAB[BOS], VOCAB[EOS]
    for tok in both(folder):
        ids = encode_prompt(MESSAGES, tokenizer=tok)
        assert ids[0] == bos and eos not in ids


@pytest.mark.parametrize("template", ["auto", "plain"])
def test_counts_equal_the_encoded_prompts(bos_folder: Path, tmp_path: Path, template: str) -> None:
    """`rlvr validate`'s counts (FastTokenizer, batched) equal the ids the rollout encodes (transformers)."""
    samples = [
        Sample(id=str(i), domain="d", messages=[{"role": "user", "content": "x" * i}], tag="t") for i in range(1, 6)
    ]
    for folder in (bos_folder, char_folder(tmp_path / "tpl", single="<bos> $A", template=BOS_TEMPLATE), POLICY):
        theirs, ours = both(folder)
        encoded = [len(encode_prompt(s.messages, tokenizer=theirs, template=template)) for s in samples]
        assert prompt_lengths(samples, tokenizer=ours, template=template) == encoded
        assert prompt_lengths(samples, tokenizer=theirs, template=template) == encoded


def test_plan_shows_the_bos_of_a_plain_prompt(bos_folder: Path) -> None:
    sample = Sample(id="r", domain="d", messages=[{"role": "user", "content": "hi"}], tag="t")
    for tokenizer in both(bos_folder):
        example = prompt_example(sample, tokenizer=tokenizer, template="auto")
        assert example.text == "<bos>user: hi\nassistant: "
        assert example.tokens == len(encode_prompt(sample.messages, tokenizer=tokenizer))


def test_the_quickstart_tokenizer_adds_nothing() -> None:
    """The quickstart's char model (and SmolLM2, tests/real) adds no special token: its prompts are unchanged."""
    for tokenizer in both(POLICY):
        assert special_prefix(tokenizer) == ()
        text = render_prompt(MESSAGES, tokenizer=tokenizer, template="plain")
        assert encode_prompt(MESSAGES, tokenizer=tokenizer, template="plain") == list(
            tokenizer(text, add_special_tokens=False)["input_ids"]
        )
