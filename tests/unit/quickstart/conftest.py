from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from rlvr.tiny import build_char_tokenizer

    return build_char_tokenizer()
