"""The char tokenizer (tiny models, the shipped quickstart/tools models) has a token for every
character it lists, "\\n" included: "." in its split pattern skipped newlines, so "\\n\\n" became <unk>."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT

TEXT = "def f(x):\n\n\treturn x  # two newlines, a tab\n"


@pytest.mark.parametrize("folder", ["quickstart/policy", "quickstart/judge", "tools/policy", None])
def test_every_character_round_trips_without_unk(folder: str | None) -> None:
    from transformers import AutoTokenizer

    from rlvr.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer() if folder is None else AutoTokenizer.from_pretrained(ROOT / "recipes" / folder)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert tokenizer.unk_token_id not in ids
    assert len(ids) == len(TEXT) and tokenizer.decode(ids) == TEXT
