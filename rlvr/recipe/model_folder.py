"""What a HF model folder says, read without torch or transformers: whether all its weights are there
(`weights_problem`, for `rlvr validate` and the hub cache), its `max_position_embeddings`, and so the
longest sequence a step of a recipe can make (`longest_sequence`: the servers' launch flags, the
memory estimate and the KV-cache check all size for it).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.recipe.schema import Recipe

WEIGHT_FILES = "model.safetensors, model-*.safetensors shards with model.safetensors.index.json, or pytorch_model.bin"


def weights_problem(folder: Path) -> str | None:
    """None when the model folder has weight files (and every shard its index lists), else why not."""
    indexes = sorted(folder.glob("*.index.json"))
    weights = [p for pattern in ("*.safetensors", "*.bin") for p in folder.glob(pattern)]
    if not indexes and not weights:
        return f"{folder} has config.json but no weights (expected {WEIGHT_FILES})"
    for index in indexes:
        try:
            shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        except (OSError, ValueError, AttributeError) as exc:
            return f"{index} is not a weight index: {exc}"
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            return (
                f"{index} lists {len(shards)} weight file(s) and {len(missing)} are missing (first: {missing[0]}); "
                "the download is incomplete"
            )
    return None


def max_positions(model_path: str | None) -> int:
    """The model folder's `max_position_embeddings` (0 when unknown)."""
    try:
        config = json.loads((Path(model_path or "") / "config.json").read_text())
        return int(config.get("max_position_embeddings") or 0)
    except (OSError, ValueError, TypeError):
        return 0


def longest_sequence(recipe: Recipe, *, capped: bool = True) -> int:
    """The longest sequence a step can make (what `rlvr serve --max-seq-len` and vLLM's
    `--max-model-len` are launched with, and what the memory estimate sizes the KV cache for): the
    prompt limit plus the longest response or tool episode (`Recipe.longest_episode`), capped at the
    model's `max_position_embeddings` when it is known (`capped=False`: not capped)."""
    longest = recipe.data.max_prompt_tokens + recipe.longest_episode()[1]
    limit = max_positions(recipe.model.path) if capped else 0
    return min(longest, limit) if limit else longest
