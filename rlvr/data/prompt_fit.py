"""How many of a domain's rows fit `data.max_prompt_tokens`, counted before anything starts.

The rollout skips a row whose rendered prompt (chat template, system message and the domain's
tool instructions included) is longer than `data.max_prompt_tokens`. `rlvr validate` and `rlvr
plan` count those rows up front, rendered and counted as the rollout encodes them (`rlvr.data.chat`'s
`render_prompt` and, for a plain prompt, the tokenizer's BOS that `encode_prompt` puts first, and the
caller's `messages` function that adds the tool instructions),
so a domain whose prompts are all too long is an error before launch, and one that loses some
rows says how many.

Fast: prompts are rendered once and tokenized in one batch call. A domain with more than
`SAMPLE_ROWS` rows is counted on a seeded random sample of that many (the counts are then
estimates, and say so).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.data.base import LoadReport
from rlvr.data.chat import prompt_specials, render_prompt
from rlvr.data.sources import read_rows
from rlvr.recipe.tokenizer import TokenizerProblem, load_tokenizer
from rlvr.types import Sample

Problem = tuple[tuple[str, ...], str]
"""(key path, message): the CLI prints `file:line: key.path: message` and exits 2."""
Messages = Callable[[Sample], list[dict[str, str]]]

SAMPLE_ROWS = 20_000
"""Rows counted per domain; more are sampled (rendering a chat template costs ~20-50 us a row)."""


class PromptError(Exception):
    """A row the chat template cannot render; `str()` names the row and the template's message."""


@dataclass
class PromptFit:
    """Rows of one domain's files against `data.max_prompt_tokens`."""

    rows: int = 0
    """Rows the domain loaded (after bad-row skipping and filters)."""
    counted: int = 0
    """Rows rendered and tokenized (`rows`, or a sample of SAMPLE_ROWS)."""
    too_long: int = 0
    """Counted rows longer than max_prompt_tokens."""
    longest: int = 0
    """Longest counted prompt, in tokens."""
    shortest: int = 0
    """Shortest counted prompt, in tokens."""

    @property
    def sampled(self) -> bool:
        return self.counted < self.rows

    @property
    def estimated_too_long(self) -> int:
        """Rows over the limit: exact when every row was counted, else scaled up from the sample."""
        if not self.sampled:
            return self.too_long
        return round(self.too_long * self.rows / max(self.counted, 1))

    @property
    def none_fit(self) -> bool:
        """Every row is too long (known only when every row was counted)."""
        return self.rows > 0 and not self.sampled and self.too_long == self.rows


def prompt_lengths(
    samples: Sequence[Sample],
    *,
    tokenizer: Any,
    template: str,
    messages: Messages | None = None,
) -> list[int]:
    """Token count of each sample's rendered prompt; PromptError naming the first row the chat
    template cannot render (a template that refuses a system message, say)."""
    texts = []
    for sample in samples:
        try:
            texts.append(
                render_prompt(messages(sample) if messages else sample.messages, tokenizer=tokenizer, template=template)
            )
        except Exception as exc:  # noqa: BLE001 - a chat template raises whatever it likes
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise PromptError(f"row {sample.id!r}: the tokenizer's chat template fails on it: {text}") from None
    if not texts:
        return []
    specials = len(prompt_specials(tokenizer, template))  # a plain prompt's BOS, as encode_prompt adds it
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is not None:
        return [specials + len(ids) for ids in encode_batch(texts)]
    return [specials + len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def prompt_example(sample: Sample, *, tokenizer: Any, template: str, messages: Messages | None = None) -> PromptExample:
    """`sample`'s prompt rendered as the rollout renders it, and its length in tokens."""
    text = render_prompt(messages(sample) if messages else sample.messages, tokenizer=tokenizer, template=template)
    (tokens,) = prompt_lengths([sample], tokenizer=tokenizer, template=template, messages=messages)
    return PromptExample(
        row_id=sample.id, text=_token_text(tokenizer, prompt_specials(tokenizer, template)) + text, tokens=tokens
    )


def _token_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """The special tokens `encode_prompt` puts before a plain prompt, as text (`<bos>`)."""
    if not ids:
        return ""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    tokens = convert(list(ids)) if convert is not None else [tokenizer.core.id_to_token(i) for i in ids]
    return "".join(str(t) for t in tokens)


def fit_prompts(
    samples: Sequence[Sample],
    *,
    tokenizer: Any,
    template: str,
    max_tokens: int,
    messages: Messages | None = None,
    seed: int = 0,
    sample_rows: int = SAMPLE_ROWS,
) -> PromptFit:
    """Count `samples` (one domain's rows) against `max_tokens` (see the module docstring)."""
    counted = list(samples)
    if len(counted) > sample_rows:
        counted = random.Random(seed).sample(counted, sample_rows)
    lengths = prompt_lengths(counted, tokenizer=tokenizer, template=template, messages=messages)
    return PromptFit(
        rows=len(samples),
        counted=len(lengths),
        too_long=sum(1 for n in lengths if n > max_tokens),
        longest=max(lengths, default=0),
        shortest=min(lengths, default=0),
    )


def has_rows(path: str | Path) -> bool:
    """Whether a data file holds at least one row (blank lines are not rows), reading as little
    as it can: the first non-blank line of a jsonl, a parquet file's metadata."""
    path = Path(path)
    if path.is_file() and path.suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8", errors="replace") as handle:
            return any(line.strip() for line in handle)
    if path.is_file() and path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows > 0
    return next(iter(read_rows(path)), None) is not None


@dataclass
class DataCheck:
    """What `check_data` found: an error, warnings, and the counts `rlvr plan` shows."""

    problem: Problem | None = None
    warnings: list[str] = field(default_factory=list)
    reports: dict[str, LoadReport] = field(default_factory=dict)
    """What loading each domain's training files skipped (bad rows, filters)."""
    fits: dict[str, PromptFit] = field(default_factory=dict)
    """Each domain's training rows against max_prompt_tokens (empty when not counted)."""
    eval_fits: dict[str, PromptFit] = field(default_factory=dict)
    """The same for the domains that have eval_files."""
    not_counted: str = ""
    """Why prompt tokens were not counted (no tokenizer on this machine), else empty."""
    examples: dict[str, PromptExample] = field(default_factory=dict)
    """Per domain: its first training row's prompt as the model reads it (`rlvr plan` shows it)."""

    @property
    def longest_prompt(self) -> int | None:
        """The longest prompt of every training and eval row, in tokens, when every row of every
        domain was counted (None when counting was skipped, or estimated from a sample): what the
        rollout servers' KV cache must hold besides the response (`rlvr launch` sizes it so)."""
        fits = [*self.fits.values(), *self.eval_fits.values()]
        if self.not_counted or not fits or any(fit.sampled for fit in fits):
            return None
        return max(fit.longest for fit in fits)


@dataclass
class PromptExample:
    """One row's prompt exactly as the model reads it: chat template, system message, special
    tokens and tool instructions included."""

    row_id: str
    text: str
    tokens: int


def counting_tokenizer(recipe: Any) -> tuple[Any | None, str]:
    """(tokenizer, "") to count prompt tokens with, or (None, why there is none here)."""
    folder = recipe.model.tokenizer or recipe.model.path
    if folder is None:
        return None, "model.config builds the model without a tokenizer"
    if not Path(folder).is_dir():
        return None, f"no tokenizer folder {folder} on this machine"
    try:
        return load_tokenizer(folder, trust_remote_code=recipe.model.trust_remote_code), ""
    except TokenizerProblem as exc:
        return None, str(exc)


def check_data(
    recipe: Any,
    *,
    train: dict[str, list[Sample]],
    evals: dict[str, list[Sample]],
    reports: dict[str, LoadReport],
    eval_reports: dict[str, LoadReport],
    tokenizer: Any | None,
    messages: dict[str, Messages] | None = None,
    not_counted: str = "",
) -> DataCheck:
    """The loaded rows of every domain against what a run needs, before anything starts:

    - every data file (and eval file) has a row;
    - `experiment.eval_at_start` and `eval_steps` have eval rows to score;
    - every domain keeps at least one usable row after bad-row skipping, filters and the prompt
      limit (else the trainer stops 15 s in: "a domain needs at least one sample");
    - rows whose rendered prompt is longer than `data.max_prompt_tokens` are counted (a warning
      per domain; the rollout skips them).

    `messages[domain]` renders a row's messages as the model sees them (the domain's tool
    instructions added); without a tokenizer the prompt count is skipped (`not_counted` says why).
    """
    check = DataCheck(reports=reports, not_counted="" if tokenizer is not None else not_counted)
    check.problem = _empty_file(recipe) or _no_eval_rows(recipe, evals)
    for name, domain in recipe.domains.items():
        for attr in ("files", "eval_files"):
            if check.problem is None and _sources(domain, attr):
                check.problem = _check_domain_rows(
                    recipe, check, name, attr, train=train, evals=evals, reports=reports, eval_reports=eval_reports,
                    tokenizer=tokenizer, render=(messages or {}).get(name),
                )  # fmt: skip
    return check


def _check_domain_rows(
    recipe: Any,
    check: DataCheck,
    name: str,
    attr: str,
    *,
    train: dict[str, list[Sample]],
    evals: dict[str, list[Sample]],
    reports: dict[str, LoadReport],
    eval_reports: dict[str, LoadReport],
    tokenizer: Any | None,
    render: Messages | None,
) -> Problem | None:
    """One domain's training (attr = "files") or eval rows: count them into `check`, warn about
    rows over the prompt limit, or the problem when none is usable."""
    training = attr == "files"
    samples = (train if training else evals)[name]
    report = (reports if training else eval_reports)[name]
    limit = recipe.data.max_prompt_tokens
    fit = None
    if tokenizer is not None and samples:
        try:
            fit = fit_prompts(
                samples, tokenizer=tokenizer, template=recipe.model.chat_template, max_tokens=limit,
                messages=render, seed=recipe.experiment.seed,
            )  # fmt: skip
        except PromptError as exc:
            with_tools = " (with the domain's tool instructions in a system message)" if render else ""
            return ("domains", name, attr), f"{exc}{with_tools}"
        (check.fits if training else check.eval_fits)[name] = fit
        if training:
            template = recipe.model.chat_template
            check.examples[name] = prompt_example(samples[0], tokenizer=tokenizer, template=template, messages=render)
    files = _sources(recipe.domains[name], attr)
    domain = recipe.domains[name]
    key = attr if getattr(domain, attr) else "verifiers" if getattr(domain, "verifiers", None) else "gym"
    if not samples or (fit is not None and fit.none_fit):
        why = _no_usable_row(name, files, report, fit, limit, train=training, tools=render is not None)
        return ("domains", name, key), why
    if fit is not None and fit.too_long:
        check.warnings.append(_too_long_warning(name, attr, fit, limit, gym=key == "gym"))
    if report.repeated:  # a small generator config: fewer distinct questions than rows asked for
        asked = recipe.domains[name].gym.eval_size
        check.warnings.append(
            f"domains.{name}.gym: {report.repeated} of {asked} eval rows repeat a training question; they are left out"
        )
    return None


def _sources(domain: Any, attr: str) -> list[str]:
    """Where a domain's training (attr = "files") or eval rows come from: its files, and the
    reasoning-gym generators of its gym table (rlvr/data/gym.py)."""
    out = list(getattr(domain, attr))
    gym = getattr(domain, "gym", None)
    if gym is not None and (attr == "files" or gym.eval_size):
        from rlvr.data.gym import describe

        out.append(describe(gym))
    table = getattr(domain, "verifiers", None)
    if table is not None and (attr == "files" or table.eval_args is not None):
        out.append(f"verifiers taskset {table.taskset}")
    return out


def _empty_file(recipe: Any) -> Problem | None:
    for name, domain in recipe.domains.items():
        for attr, purpose in (("files", "to train on"), ("eval_files", "to evaluate")):
            for file in getattr(domain, attr):
                if not has_rows(file):
                    return ("domains", name, attr), f"{file} has no rows; expected at least one prompt row {purpose}"
    return None


def _no_eval_rows(recipe: Any, evals: dict[str, list[Sample]]) -> Problem | None:
    """An eval with nothing to evaluate is a recipe mistake, not an empty curve point."""
    if any(evals.values()):
        return None
    if recipe.experiment.eval_at_start:
        return ("experiment", "eval_at_start"), (
            "needs eval rows, and no domain has any: give a domain eval_files (or its gym table an eval_size)"
        )
    if recipe.experiment.eval_steps:
        return ("experiment", "eval_steps"), (
            "evaluates every few steps, and no domain has eval rows: give a domain eval_files (or its gym table "
            "an eval_size), or set eval_steps = 0"
        )
    return None


def _no_usable_row(
    name: str, files: list[str], report: LoadReport, fit: PromptFit | None, limit: int, *, train: bool, tools: bool
) -> str:
    """Why a domain (or its eval set) is left without a row, e.g. `none of the 400 rows of x.jsonl
    fits data.max_prompt_tokens = 64: ...`."""
    where = files[0] if len(files) == 1 else f"its {len(files)} files"
    total = report.loaded + report.skipped + report.filtered + report.repeated
    rendered = "chat template and tool instructions included" if tools else "chat template included"
    if fit is not None and not report.skipped and not report.filtered and not report.repeated:
        fix = "raise data.max_prompt_tokens or shorten the prompts"
        if total == 1:
            return (
                f"the only row of {where} does not fit data.max_prompt_tokens = {limit}: its prompt is "
                f"{fit.shortest} tokens ({rendered}); {fix}"
            )
        return (
            f"none of the {total} rows of {where} fits data.max_prompt_tokens = {limit}: the shortest prompt is "
            f"{fit.shortest} tokens ({rendered}); {fix}"
        )
    reasons = []
    if report.skipped:
        reasons.append(f"{report.skipped} bad (skipped by data.on_bad_row = 'skip'; first: {report.first_skip})")
    if report.filtered:
        reasons.append(f"{report.filtered} filtered out by domains.{name}.filter")
    if report.repeated:
        reasons.append(f"{report.repeated} repeat a training question")
    if fit is not None:
        reasons.append(f"{fit.too_long} longer than data.max_prompt_tokens = {limit} (shortest {fit.shortest} tokens)")
    purpose = "train on" if train else "evaluate"
    return f"no row of {where} is usable ({_rows(total)}: {', '.join(reasons)}); expected at least one row to {purpose}"


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


def _too_long_warning(name: str, attr: str, fit: PromptFit, limit: int, *, gym: bool = False) -> str:
    """`domains.math: 12 of 400 rows exceed data.max_prompt_tokens = 512 (longest 731 tokens); they are skipped`."""
    one = fit.estimated_too_long == 1
    count = f"{fit.too_long} of {fit.rows} rows"
    if fit.sampled:
        count = f"about {fit.estimated_too_long} of {fit.rows} rows ({fit.too_long} of a sample of {fit.counted})"
    verb = "exceeds" if one else "exceed"
    fate = ("it is" if one else "they are") + (" skipped" if attr == "files" else " not evaluated")
    key = f"domains.{name}" if attr == "files" else f"domains.{name}.{'gym' if gym else 'eval_files'}"
    return f"{key}: {count} {verb} data.max_prompt_tokens = {limit} (longest {fit.longest} tokens); {fate}"
