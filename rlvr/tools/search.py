"""The `search` tool: BM25 over a local jsonl corpus of passages (the `bm25s` library), or a
retrieval server speaking Search-R1's `/retrieve` JSON.

Each corpus row is `{"text": ..., "title": ...(optional)}`. The index is built once per
corpus file per process and shared by every episode; answers list the top-k passages as
Search-R1 formats them: `Doc i (Title: t) text`. A remote server that is down or answers
badly makes the call fail: the model reads `error: ...` and `tools/<domain>/errors` counts it
(the run degrades, it does not stop).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from rlvr.tools.base import Tool, ToolConfigError


class SearchIndex:
    def __init__(self, path: str | Path):
        import bm25s

        self.passages = load_corpus(path)
        self._bm25s = bm25s
        self.index = bm25s.BM25()
        texts = [f"{p.get('title', '')} {p['text']}" for p in self.passages]
        self.index.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens[0][0]:  # ids of the one query: only stop words or nothing, so no passage matches
            return []
        ids, scores = self.index.retrieve(tokens, k=min(k, len(self.passages)), show_progress=False)
        return [self.passages[int(i)] for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


def load_corpus(path: str | Path) -> list[dict[str, Any]]:
    """The passages of a jsonl corpus; ToolConfigError naming file:line for a bad row."""
    path = Path(path)
    if not path.is_file():
        raise ToolConfigError(f"search corpus {str(path)!r} does not exist")
    passages = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ToolConfigError(f"{path}:{line_no}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ToolConfigError(f"{path}:{line_no}: a passage needs a string 'text'")
            passages.append(row)
    if not passages:
        raise ToolConfigError(f"search corpus {str(path)!r} has no passages")
    return passages


_INDEXES: dict[str, SearchIndex] = {}


def format_hits(hits: list[dict[str, Any]]) -> str:
    if not hits:
        return "No passage matches."
    return "\n".join(
        f"Doc {i} (Title: {h.get('title', '')}) {h['text']}" if h.get("title") else f"Doc {i} {h['text']}"
        for i, h in enumerate(hits, 1)
    )


async def retrieve(url: str, query: str, *, top_k: int, timeout_s: float) -> list[dict[str, Any]]:
    """POST Search-R1's `/retrieve` request; its documents as {title, text} (`contents` is
    `"title"\ntext`). ValueError for an answer of the wrong shape."""
    import aiohttp

    payload = {"queries": [query], "topk": top_k, "return_scores": True}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(f"{url.rstrip('/')}/retrieve", json=payload) as response,
    ):
        response.raise_for_status()
        body = await response.json()
    try:
        items = body["result"][0]
        docs = [item.get("document", item) for item in items]
        hits = []
        for doc in docs:
            if "contents" in doc:
                title, _, text = str(doc["contents"]).partition("\n")
                hits.append({"title": title.strip('"'), "text": text.strip()})
            else:
                hits.append({"title": doc.get("title", ""), "text": str(doc["text"])})
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("the retrieval server's answer is not Search-R1's {'result': [[{'document': ...}]]}") from None
    return hits[:top_k]


def search_tool(*, corpus: str | None, top_k: int, url: str | None = None, timeout_s: float = 10.0) -> Tool:
    if url:

        async def search(query: str) -> str:
            return format_hits(await retrieve(url, query, top_k=top_k, timeout_s=timeout_s))

    else:
        if not corpus:
            raise ToolConfigError("the search tool needs search_corpus (a jsonl of passages) or search_url")
        key = str(Path(corpus).resolve())
        if key not in _INDEXES:
            _INDEXES[key] = SearchIndex(key)
        index = _INDEXES[key]

        async def search(query: str) -> str:
            return format_hits(await asyncio.to_thread(index.search, query, top_k))

    return Tool(
        name="search",
        description=f"Search a passage collection; returns the top {top_k} passages.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string", "description": "What to look up."}},
            "required": ["query"],
        },
        fn=search,
    )
