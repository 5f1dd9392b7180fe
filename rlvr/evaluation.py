"""`rlvr eval` and `rlvr export`: score a model on held-out rows; turn a checkpoint into a HF folder.

A checkpoint (`RUN/checkpoints/step_N`) is DCP shards; evaluation and serving want a plain
transformers folder, so `export_checkpoint` rebuilds the model from the run's resolved recipe,
loads the shards on one CPU process and writes safetensors that `from_pretrained` loads.
Evaluation then runs the embedded engine in-process (greedy by default) and scores with
the same reward registry the training run used.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rlvr.rundir import run_of_checkpoint
from rlvr.types import Group, Sample


def export_checkpoint(checkpoint: Path, out_dir: Path, *, merge: bool = True) -> Path:
    """DCP checkpoint -> safetensors HF folder (model weights, config and tokenizer). A LoRA run's
    checkpoint gives its adapters merged into the base, or with `merge=False` a peft adapter folder
    (adapter_model.safetensors + adapter_config.json, for `PeftModel.from_pretrained` on the base)."""
    import torch

    from rlvr.recipe.load import recipe_from_json
    from rlvr.trainer.checkpoint import export_hf, load_checkpoint
    from rlvr.trainer.model import build_model, load_tokenizer

    recipe = recipe_from_json(run_of_checkpoint(checkpoint).recipe.read_text())
    trainer = recipe.trainer.model_copy(update={"strategy": "none"})
    model = build_model(recipe.model, trainer, device=torch.device("cpu"), seed=recipe.experiment.seed, trainable=False)
    actor: Any = SimpleNamespace(model=model, optimizer=None, scheduler=None)  # weights only: no optimizer state
    load_checkpoint(checkpoint, {"actor": actor})
    if recipe.trainer.lora.enabled and not merge:
        from rlvr.trainer.lora import write_adapter

        exported = write_adapter(model, out_dir)
    else:
        exported = export_hf(model, load_tokenizer(recipe.model), out_dir)
    assert exported is not None
    return exported


EXPORT_MARK = ".rlvr-export.json"
"""Written into an `rlvr eval --export-dir` folder: which checkpoint (and its meta.json's mtime) it
holds, so a later eval into the same folder reuses it instead of exporting again."""


def exports_cache() -> Path:
    """`XDG_CACHE_HOME/rlvr/exports` (else ~/.cache): where `rlvr eval` exports a checkpoint for the
    eval's length, not beside the checkpoint (a 7B model is 15 GB in a run directory nobody asked to grow)."""
    import os

    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlvr" / "exports"


def export_stamp(checkpoint: Path) -> str:
    """The checkpoint and its meta.json's mtime: a checkpoint rewritten in place is another export."""
    checkpoint = checkpoint.resolve()
    return f"{checkpoint}:{(checkpoint / 'meta.json').stat().st_mtime_ns}"


def _export_stamp_in(mark: Path) -> str | None:
    try:
        return json.loads(mark.read_text()).get("stamp")
    except (OSError, ValueError, AttributeError):
        return None


class ExportDirError(ValueError):
    """`--export-dir` names a folder that holds something other than this checkpoint's export."""


@contextmanager
def exported_for_eval(
    checkpoint: Path, *, export_dir: Path | None = None, announce: Callable[[str], Any] = print
) -> Iterator[Path]:
    """A HF folder of `checkpoint` for the length of the `with`.

    Without `export_dir`: a fresh folder under `exports_cache()`, removed when the `with` ends
    (however it ends), so an eval leaves no 500 MB-15 GB copy behind. With `export_dir`: the folder
    is kept, and reused by a later eval of the same checkpoint (`EXPORT_MARK` says which); a
    folder that holds anything else is an ExportDirError (never overwritten)."""
    import shutil
    import tempfile

    stamp = export_stamp(checkpoint)
    if export_dir is not None:
        mark = export_dir / EXPORT_MARK
        if (export_dir / "config.json").is_file() and _export_stamp_in(mark) == stamp:
            announce(f"reusing the export of {checkpoint} in {export_dir}")
            yield export_dir
            return
        if export_dir.exists() and (not export_dir.is_dir() or any(export_dir.iterdir())):
            raise ExportDirError(
                f"--export-dir {export_dir}: holds something other than an export of {checkpoint}; "
                "expected a new or empty folder (or one an earlier eval of this checkpoint exported into)"
            )
        announce(f"exporting {checkpoint} to {export_dir} (kept: a later eval with this --export-dir reuses it)")
        export_checkpoint(checkpoint, export_dir)
        mark.write_text(json.dumps({"checkpoint": str(checkpoint.resolve()), "stamp": stamp}) + "\n")
        yield export_dir
        return
    cache = exports_cache()
    cache.mkdir(parents=True, exist_ok=True)
    run = checkpoint.resolve().parent.parent.name
    scratch = Path(tempfile.mkdtemp(prefix=f"{run}-{checkpoint.name}-", dir=cache))
    folder = scratch / "hf"
    announce(f"exporting {checkpoint} to {folder} (removed after the eval; --export-dir DIR keeps it)")
    try:
        export_checkpoint(checkpoint, folder)
        yield folder
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class EvalRow:
    sample: Sample
    completion: str
    score: float
    reason: str
    failed: str | None = None  # the reward could not judge it: left out of the means, counted
    prompt: str = ""  # the prompt as the model read it (chat template and special tokens included)
    finish_reason: str = ""  # "stop", or "length": cut at max_new_tokens


def load_rows(files: list[Path], *, reward: str | None, tag_rewards: dict[str, tuple[str, dict]]) -> list[Sample]:
    """Rows from eval files (bad rows are errors); with a recipe, each tag picks its domain's reward."""
    from rlvr.data.base import DataError
    from rlvr.data.sources import read_rows, row_to_sample

    samples = []
    for file in files:
        for number, row in read_rows(file):
            where = f"{file}:{number}"
            tag = row.get("tag") if isinstance(row, dict) else None
            name = reward or (tag_rewards.get(tag, ("", {}))[0] if isinstance(tag, str) else "")
            if not name:
                raise DataError(f"{where}: tag {tag!r} has no reward (pass --reward or a recipe whose domains own it)")
            try:
                sample = row_to_sample(row, where=where, default_tag="eval", reward=name)
            except ValueError as exc:
                raise DataError(f"{where}: {exc}") from None
            sample.domain = sample.tag
            samples.append(sample)
    return samples


DEFAULT_MAX_NEW_TOKENS = 256
"""`rlvr eval`'s response limit when neither --max-new-tokens nor a recipe gives one."""


def evaluate(
    model_dir: Path,
    samples: list[Sample],
    *,
    rewards: dict[str, tuple[str, dict[str, Any]]],
    chat_template: str = "auto",
    n: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_batch: int = 64,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
) -> list[EvalRow]:
    """Generate with the embedded engine and score each sample with its tag's reward.

    `stop` / `stop_token_ids`: the recipe's `rollout.stop` and `rollout.stop_token_ids`, so a few-shot
    prompt's answer ends where rollout ends it (a base model otherwise writes the next shot).

    The prompts are tokenized first, so the engine's KV cache is sized for what this eval makes
    (its longest prompt plus `max_new_tokens`, at most `max_batch` sequences at once), not for the
    engine's default 2048 tokens x 64 sequences."""
    from transformers import AutoTokenizer

    from rlvr.data.chat import encode_prompt, render_prompt
    from rlvr.rewards.pool import RewardPool
    from rlvr.rollout.base import GenerateRequest, SamplingParams
    from rlvr.server.embedded import EmbeddedEngine

    tokenizer = AutoTokenizer.from_pretrained(model_dir)  # the engine's own (it loads the same folder)
    prompts = [render_prompt(s.messages, tokenizer=tokenizer, template=chat_template) for s in samples]
    ids = [encode_prompt(s.messages, tokenizer=tokenizer, template=chat_template) for s in samples]
    longest = max(map(len, ids), default=1)
    engine = EmbeddedEngine(
        model_dir, max_batch=max(1, min(max_batch, len(samples) * n)), max_seq_len=longest + max_new_tokens
    )
    params = SamplingParams(
        temperature=temperature, max_new_tokens=max_new_tokens, seed=0, stop=list(stop),
        stop_token_ids=list(stop_token_ids),
    )  # fmt: skip
    requests = [GenerateRequest(input_ids=prompt_ids, params=params, n=n) for prompt_ids in ids]
    pool = RewardPool.from_domains(rewards)

    async def run() -> list[Group]:
        completions = await engine.generate(requests)
        groups = [Group(sample=s, completions=completions[i * n : (i + 1) * n]) for i, s in enumerate(samples)]
        await pool.score_groups(groups)
        return groups

    try:
        groups = asyncio.run(run())
    finally:
        pool.close()
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    return [
        EvalRow(
            sample=g.sample,
            completion=c.text,
            score=r.score,
            reason=str(r.info.get("reason", "")),
            failed=r.failed,
            prompt=prompt,
            finish_reason=c.finish_reason,
        )  # fmt: skip
        for g, prompt in zip(groups, prompts, strict=True)
        for c, r in zip(g.completions, g.rewards, strict=True)
    ]


Generate = Callable[[list[Sample], int, float], Awaitable[list[Group]]]


async def evaluate_groups(
    evals: Mapping[str, Sequence[Sample]],
    *,
    generate: Generate,
    rewards: Any,
    settings: Mapping[str, tuple[int, float]] | None = None,
    scored: Callable[[list[Group]], None] | None = None,
) -> dict[str, float]:
    """Answer every domain's eval rows (`n` samples at `temperature`, per domain) and score them.

    `generate(samples, n, temperature)` returns one Group per sample (the controller passes
    its engine call); `rewards` is the run's RewardPool, so each row is judged by its
    domain's reward whatever its own tag. `scored` sees the scored groups (the run logs a few
    eval episodes to samples.jsonl). Returns `eval_metrics` of the scored groups.
    """
    groups: list[Group] = []
    for domain, samples in evals.items():
        if samples:
            n, temperature = (settings or {}).get(domain, (1, 0.0))
            groups += await generate(list(samples), n, temperature)
    if not groups:
        return {}
    await rewards.score_groups(groups)
    if scored is not None:
        scored(groups)
    return eval_metrics(groups, threshold=float(getattr(rewards, "threshold", 1.0)))


def eval_metrics(groups: Sequence[Group], *, threshold: float = 1.0) -> dict[str, float]:
    """Per benchmark: `eval/<domain>/<tag>/{mean,accuracy}` (+ `pass@k` when k > 1); per domain:
    `eval/reward/<domain>/{mean,accuracy}`. Samples the reward could not judge are left out of
    both and counted as `.../failed` (a judge that was down is not a model that got worse).

    With k samples per row (`eval_n`), mean and accuracy are over all k samples (mean@k)
    and pass@k is the fraction of rows with at least one sample at or above `threshold`,
    so small benchmarks such as AIME can be read both ways.
    """
    buckets: dict[tuple[str, ...], list[Group]] = {}
    for group in groups:
        domain = group.sample.domain or group.sample.tag
        buckets.setdefault(("reward", domain), []).append(group)
        buckets.setdefault((domain, group.sample.tag), []).append(group)
    out: dict[str, float] = {}
    for key, items in buckets.items():
        judged = [[r.score for r in g.rewards if r.judged] for g in items]
        scores = [s for group in judged for s in group]
        prefix = "eval/" + "/".join(key)
        out[f"{prefix}/mean"] = sum(scores) / max(len(scores), 1)
        out[f"{prefix}/accuracy"] = sum(s >= threshold for s in scores) / max(len(scores), 1)
        failed = sum(len(g.rewards) - len(j) for g, j in zip(items, judged, strict=True))
        if failed:
            out[f"{prefix}/failed"] = float(failed)
        k = max(len(g.scores) for g in items)
        if k > 1 and key[0] != "reward":
            rows = [group for group in judged if group]
            out[f"{prefix}/pass@{k}"] = sum(max(group) >= threshold for group in rows) / max(len(rows), 1)
    return out


def summarize(rows: list[EvalRow]) -> dict[str, dict[str, float]]:
    """Per tag and overall: judged `count`, `mean`, `accuracy`, and `failed` (could not judge)."""
    by_tag: dict[str, list[EvalRow]] = {}
    for row in rows:
        by_tag.setdefault(row.sample.tag, []).append(row)
    return {tag: _stats(items) for tag, items in {**by_tag, "all": rows}.items()}


def _stats(rows: list[EvalRow]) -> dict[str, float]:
    scores = [row.score for row in rows if row.failed is None]
    return {
        "count": len(scores),
        "mean": sum(scores) / max(len(scores), 1),
        "accuracy": sum(x >= 1 for x in scores) / max(len(scores), 1),
        "failed": len(rows) - len(scores),
        "truncated": sum(row.finish_reason == "length" for row in rows),
    }


def write_rows(rows: list[EvalRow], path: Path) -> None:
    with path.open("w") as handle:
        for row in rows:
            handle.write(
                json.dumps(
                    {
                        "id": row.sample.id,
                        "tag": row.sample.tag,
                        "prompt": row.prompt,
                        "completion": row.completion,
                        "finish_reason": row.finish_reason,
                        "score": None if row.failed else row.score,
                        "verdict": "failed" if row.failed else "scored",
                        "reason": row.reason,
                    }
                )
                + "\n"
            )
