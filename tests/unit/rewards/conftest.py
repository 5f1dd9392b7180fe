from __future__ import annotations

import pytest

from rlvr.types import Completion, Sample


def make_sample(**fields) -> Sample:
    fields.setdefault("id", "s1")
    fields.setdefault("tag", "t")
    fields.setdefault("messages", [{"role": "user", "content": "question?"}])
    return Sample(**fields)


def make_completion(text: str) -> Completion:
    return Completion(text=text, token_ids=[], logprobs=[])


def code_completion(code: str) -> Completion:
    return make_completion(f"Here is my solution.\n```python\n{code}\n```\n")


@pytest.fixture(scope="session", autouse=True)
def _close_worker_pools():
    yield
    from rlvr.rewards.workers import close_shared_pools

    close_shared_pools()


def sandbox_available() -> bool:
    from rlvr.sandbox.local import available_mode

    try:
        return available_mode("bwrap") == "bwrap"
    except RuntimeError:
        return False


needs_bwrap = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap is not usable here")
