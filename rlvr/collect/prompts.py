"""Prompts as the model sees them: token ids, text, and whether they fit `data.max_prompt_tokens`.

Token ids are kept in an LRU sized to what is in flight: every round of the k + 1 waves admitted,
the wave being taken, and the largest eval domain (never every prompt ever drawn). `tokenize` fills
it on a worker thread so chat templates never hold the event loop; any thread may read it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.data.chat import encode_prompt, render_prompt
from rlvr.recipe.schema import Recipe
from rlvr.tools.session import Toolbox
from rlvr.types import Sample


class PromptCache:
    """The prompt ids of `recipe`'s rows, tool instructions included for `toolboxes`' domains."""

    def __init__(self, recipe: Recipe, *, tokenizer: Any, toolboxes: Mapping[str, Toolbox], eval_rows: int) -> None:
        self.recipe = recipe
        self.tokenizer = tokenizer
        self.toolboxes = toolboxes
        rounds = recipe.data.prompts_per_step * (recipe.algorithm.max_refill_rounds + 1)
        self.capacity = rounds * (recipe.rollout.max_staleness + 2) + eval_rows
        self._ids: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()
        self._lock = threading.Lock()  # the cache: the event loop and the tokenizing thread share it
        self._tokenizer_lock = threading.Lock()  # a HF fast tokenizer used by two threads at once can raise

    def __len__(self) -> int:
        """How many prompts' ids are cached."""
        return len(self._ids)

    def prompt_ids(self, sample: Sample) -> list[int]:
        """The prompt's token ids: from the LRU when this step already asked (`tokenize` fills it off
        the event loop before a round's episodes start), else tokenized here. Any thread."""
        # Keyed by the messages too: a train row and an eval row may share an id.
        key = (sample.domain, sample.id, tuple((m["role"], m["content"]) for m in sample.messages))
        with self._lock:
            ids = self._ids.get(key)
            if ids is not None:
                self._ids.move_to_end(key)
                return ids
        with self._tokenizer_lock:
            ids = encode_prompt(
                self.model_messages(sample), tokenizer=self.tokenizer, template=self.recipe.model.chat_template
            )
        with self._lock:
            self._ids[key] = ids
            while len(self._ids) > self.capacity:
                self._ids.popitem(last=False)
        return ids

    async def tokenize(self, samples: Sequence[Sample]) -> None:
        """Tokenize a round's prompts on a worker thread: a round's chat templates and encodings on the
        event loop would hold every episode, reward and weight-push call behind them."""
        await asyncio.to_thread(lambda: [self.prompt_ids(s) for s in samples])

    def prompt_text(self, sample: Sample) -> str:
        """The prompt as the model sees it (tool instructions included), as text."""
        return render_prompt(
            self.model_messages(sample), tokenizer=self.tokenizer, template=self.recipe.model.chat_template
        )

    def model_messages(self, sample: Sample) -> list[dict[str, str]]:
        """The row's messages with its domain's tool instructions, if it has tools."""
        box = self.toolboxes.get(sample.domain)
        return box.prompt_messages(sample.messages) if box is not None else sample.messages

    def fits(
        self, samples: Sequence[Sample], *, dropped: dict[str, list[tuple[str, int]]] | None = None
    ) -> list[Sample]:
        """The samples whose prompt fits `data.max_prompt_tokens`; the others go into `dropped`."""
        limit, out = self.recipe.data.max_prompt_tokens, []
        for sample in samples:
            size = len(self.prompt_ids(sample))
            if size <= limit:
                out.append(sample)
            elif dropped is not None:
                dropped.setdefault(sample.domain, []).append((sample.id, size))
        return out
