"""`rlvr plan`'s rich rendering: what will run, where, and how each step's batch is split."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rlvr.data.mixture import QuotaSchedule
from rlvr.data.prompt_fit import DataCheck, PromptExample
from rlvr.recipe.plan import LaunchPlan
from rlvr.recipe.presets import resolve_algorithm
from rlvr.recipe.schema import Recipe

QUOTA_STEPS = 4
PROMPT_HEAD_CHARS = 900
PROMPT_TAIL_CHARS = 300
"""A rendered prompt longer than head + tail characters shows its start and its end (where the
generation prompt is) with the cut between them counted."""


def print_plan(
    recipe: Recipe,
    plan: LaunchPlan,
    *,
    data: DataCheck | None,
    resolved_path: Path | None,
    console: Console | None = None,
) -> None:
    console = console or Console()
    exp, algo = recipe.experiment, recipe.algorithm
    model = recipe.model.path or "(built from model.config)"
    tables = [domain_table(recipe, data)]
    from rlvr.monitor.gym_view import gym_table

    if (gym := gym_table(recipe)) is not None:  # the domains whose rows reasoning-gym generates
        tables.append(gym)
    if any(d.tools for d in recipe.domains.values()):
        tables.append(tools_table(recipe))
    tables += [algorithm_table(recipe), cluster_table(recipe, plan)]
    memory = memory_table(recipe, plan)
    if isinstance(memory, Table):
        tables.append(memory)
    widen_for_files(console, tables)
    console.rule(f"[bold]{exp.name}[/]")
    console.print(
        f"model [cyan]{model}[/] · preset [cyan]{algo.preset}[/] · {exp.max_steps} steps · "
        f"{recipe.data.prompts_per_step} prompts x n={recipe.rollout.n} = "
        f"[bold]{recipe.data.prompts_per_step * recipe.rollout.n}[/] sequences/step · seed {exp.seed}"
    )
    for i, table in enumerate(tables):
        console.print(table)
        if i == 0 and data is not None:  # under the task mix: what one prompt of each domain looks like
            for name, example in data.examples.items():
                console.print(prompt_panel(name, example))
    if isinstance(memory, str):
        console.print(memory, markup=False, highlight=False)
    if resolved_path is not None:
        console.print(f"resolved recipe written to [green]{resolved_path}[/]")


def widen_for_files(console: Console, renderables: list[Table]) -> None:
    """A terminal fits tables to its width (truncating cells with …); `rlvr plan > plan.txt` or a
    CI log has no width to fit, so there the console grows until every cell prints whole."""
    if console.is_terminal:
        return
    wide = console.options.update_width(1_000_000)
    need = max(Measurement.get(console, wide, table).maximum for table in renderables)
    console.width = max(console.width, need)
    console.soft_wrap = True  # and a long line of text stays one line


def domain_table(recipe: Recipe, data: DataCheck | None) -> Table:
    """One row per domain: its reward and share, the rows it loaded, skipped and loses to the prompt
    limit (`too long`), and the first steps' quotas. The caption says how prompts were counted."""
    schedule = QuotaSchedule(recipe.data.domain_interleave_probs, prompts_per_step=recipe.data.prompts_per_step)
    shown = min(QUOTA_STEPS, recipe.experiment.max_steps)  # a 3-step run has no step 4 to show
    steps = [schedule.next() for _ in range(shown)]
    table = Table(title="Task mix (prompts per step)", title_justify="left")
    numeric = ("prob", "rows", "skipped", "too long", "longest", "mean")
    for column in ("domain", "tags", "reward", "prob", "rows", "skipped", "too long", "longest"):
        table.add_column(column, justify="right" if column in numeric else "left", no_wrap=True)
    table.add_column("quota step 1" if shown == 1 else f"quota steps 1-{shown}", no_wrap=True)
    table.add_column("mean", justify="right", no_wrap=True)
    reports = data.reports if data else {}
    fits = data.fits if data else {}
    for name, domain in recipe.domains.items():
        report = reports.get(name)
        fit = fits.get(name)
        prob = recipe.data.domain_interleave_probs[name]
        quotas = "/".join(str(step.get(name, 0)) for step in steps)
        table.add_row(
            name,
            ", ".join(domain.tags),
            domain.reward,
            f"{prob:g}",
            str(report.loaded) if report else "-",
            str(report.skipped + report.filtered) if report else "-",
            (f"~{fit.estimated_too_long}" if fit.sampled else str(fit.too_long)) if fit else "-",
            str(fit.longest) if fit else "-",
            quotas,
            f"{prob * recipe.data.prompts_per_step:.2f}",
        )
    table.caption = "\n".join(line for line in (mix_caption(recipe), prompt_caption(recipe, data)) if line)
    return table


def mix_caption(recipe: Recipe) -> str:
    """The adaptive mix's rule and bounds, and each difficulty pool's, when the recipe has them."""
    lines = []
    if recipe.data.mix == "adaptive":
        bounds = ", ".join(f"{name} {lo:g}-{hi:g}" for name, (lo, hi) in recipe.mix_bounds().items())
        lines.append(
            f"mix adaptive: shares start at prob and follow each domain's groups with a reward spread "
            f"(smoothing {recipe.data.mix_smoothing:g}), within {bounds}; quotas shown are the start's"
        )
    for name, domain in recipe.domains.items():
        if (pool := domain.pool) is not None:
            back = (
                f"back after {pool.revisit_after} steps"
                if pool.revisit_after
                else f"drawn at rate {pool.revisit_rate:g}"
            )
            alike = (
                f"all-correct or all-wrong {pool.retire_after}x"
                if pool.failed_after == pool.retire_after
                else f"all-correct {pool.retire_after}x or all-wrong {pool.failed_after}x"
            )
            lines.append(f"pool {name}: a prompt {alike} in a row rests, {back}")
    return "\n".join(lines)


def prompt_panel(domain: str, example: PromptExample) -> RenderableType:
    """A domain's first prompt exactly as the model reads it (chat template, its system message
    and special tokens included); `↵` marks each newline and `␠` a space that ends a line, so what
    ends the prompt is seen too. A long prompt keeps its first PROMPT_HEAD_CHARS and last
    PROMPT_TAIL_CHARS characters."""
    text = example.text
    body = Text()
    cut = len(text) - PROMPT_HEAD_CHARS - PROMPT_TAIL_CHARS
    parts = [text] if cut <= 0 else [text[:PROMPT_HEAD_CHARS], text[-PROMPT_TAIL_CHARS:]]
    for i, part in enumerate(parts):
        if i:
            body.append(f"\n… {cut:,} characters cut …\n", style="italic yellow")
        for j, line in enumerate(part.split("\n")):
            if j:
                body.append("↵\n", style="dim")
            stripped = line.rstrip(" ")
            body.append(stripped)
            body.append("␠" * (len(line) - len(stripped)), style="dim")  # a trailing space, seen
    title = f"prompt of domains.{domain}: row {example.row_id}, {example.tokens} tokens, as the model reads it"
    legend = "↵ newline · ␠ trailing space"
    return Panel(body, title=title, title_align="left", expand=False, subtitle=legend, subtitle_align="right")


def prompt_caption(recipe: Recipe, data: DataCheck | None) -> str:
    """How `too long` was counted, or why it was not."""
    limit = recipe.data.max_prompt_tokens
    if data is None:
        return ""
    if data.not_counted:
        return f"prompt tokens not counted: {data.not_counted}"
    tools = any(d.tools and d.tool_instructions for d in recipe.domains.values())
    rendered = "chat template and tool instructions included" if tools else "chat template included"
    caption = f"too long: prompts over data.max_prompt_tokens = {limit} tokens ({rendered}); the rollout skips them"
    if any(fit.sampled for fit in data.fits.values()):
        caption += f" (~: estimated from a sample of {max(f.counted for f in data.fits.values())} rows)"
    lost = [f"{name} {fit.estimated_too_long}" for name, fit in data.eval_fits.items() if fit.too_long]
    if lost:
        caption += f" · eval rows too long: {', '.join(lost)}"
    return caption


def algorithm_table(recipe: Recipe) -> Table:
    algo = recipe.algorithm
    preset_values = resolve_algorithm(algo.preset, {})
    table = Table(title=f"Algorithm: preset {algo.preset} (* = set by the recipe)", title_justify="left")
    table.add_column("knob")
    table.add_column("value")
    table.add_column("knob")
    table.add_column("value")
    items = [(k, v) for k, v in algo.model_dump().items() if k != "preset"]
    cells = [(f"{k}{'*' if preset_values.get(k) != v else ''}", repr(v)) for k, v in items]
    half = (len(cells) + 1) // 2
    for left, right in zip(cells[:half], cells[half:] + [("", "")], strict=False):
        table.add_row(*left, *right)
    return table


def cluster_table(recipe: Recipe, plan: LaunchPlan) -> Table:
    table = Table(title=f"Cluster: {plan.kind}", title_justify="left")
    for column in ("role", "node", "processes / GPUs", "port"):
        table.add_column(column)
    device = f"{plan.gpus_per_node} GPU(s)" if plan.gpus_per_node else "CPU"
    if plan.trainer_gpus:  # a local run names its GPUs: the trainer's are not the servers' (unless colocated)
        device = f"GPUs {_gpus(plan.trainer_gpus)}"
    for node in plan.trainer_nodes:
        table.add_row(
            f"trainer ({recipe.trainer.strategy}, {recipe.model.impl})",
            _node(plan, node),
            f"{plan.trainer_procs_per_node} rank(s) on {device}" + _mesh(plan),
            str(plan.master_port) if node == 0 else "",
        )
    engine = _engine_label(recipe)
    for server in plan.servers:
        gpus = f"GPUs {_gpus(server.gpus)}" if server.gpus else "CPU"
        if plan.colocate:
            gpus += " (colocated: sleeps while the trainer trains)"
        table.add_row(f"rollout {server.index} ({engine})", _node(plan, server.node), gpus, str(server.port))
    table.caption = (
        f"trainer world size {plan.trainer_world_size} (dp {plan.dp_size} x tp {plan.tp_size}) · "
        f"{len(plan.servers)} rollout server(s) · "
        f"sync {recipe.sync.method}, {recipe.sync.bucket_mb} MB buckets · {_rollout_mode(recipe)}"
    )
    return table


def _gpus(gpus: list[int]) -> str:
    return ",".join(map(str, gpus))


def memory_table(recipe: Recipe, plan: LaunchPlan) -> Table | str:
    """Per GPU of each role: what it holds at its peak (`rlvr.recipe.memory`), against the GPU's
    memory; `~` marks estimates (activations, KV cache at a memory fraction), the rest is exact.
    Without an estimate, the one line that says why (a plan that is silent looks like a bug)."""
    from rlvr.recipe.memory import estimate, gib

    est = estimate(recipe, plan)
    if est.skipped:
        return f"Memory per GPU: no estimate ({est.skipped})"
    gpu = f"{gib(est.gpu_bytes)} GiB per GPU ({est.gpu_source})" if est.gpu_bytes else "GPU memory unknown"
    table = Table(title=f"Memory per GPU (estimate; {gpu})", title_justify="left")
    for column in ("GPU(s)", "role", "holds", "GiB"):
        table.add_column(column, justify="right" if column == "GiB" else "left", no_wrap=column != "holds")
    for load in est.loads:
        first = True
        for term in load.terms:
            size = ("" if term.exact else "~") + gib(term.bytes)
            table.add_row(_gpus(load.gpus) if first else "", load.role if first else "", term.name, size)
            first = False
        fits = ""
        if est.gpu_bytes:
            fits = " (fits)" if load.total <= est.gpu_bytes and load.shortfall is None else " (does NOT fit)"
        table.add_row("", "", f"[bold]total[/]{fits}" + (f" · {load.note}" if load.note else ""), gib(load.total))
    table.caption = "exact: parameters, gradients, optimizer states, weights; ~: activations and KV cache"
    return table


def _engine_label(recipe: Recipe) -> str:
    """The engine, and for vLLM the version its Python has (or what is wrong with it)."""
    engine = recipe.rollout.engine
    if engine != "vllm":
        return engine
    from rlvr.recipe.checks import vllm_probe

    version, why = vllm_probe(recipe.rollout.vllm.python)
    tp = recipe.rollout.vllm.tp_size
    return f"vllm {version}, tp {tp}" if version else f"vllm: {why}"


def _rollout_mode(recipe: Recipe) -> str:
    k = recipe.rollout.max_staleness
    if k == 0:
        return "rollout synchronous (max_staleness 0)"
    return (
        f"rollout asynchronous (max_staleness {k}, {'partial' if recipe.rollout.partial else 'restart'} on weight push)"
    )


def _mesh(plan: LaunchPlan) -> str:
    """The node's trainer ranks as dp x tp (TP groups are consecutive ranks of one node)."""
    per_node = plan.trainer_procs_per_node
    if plan.tp_size == 1:
        return ""
    return f" = dp {per_node // plan.tp_size} x tp {plan.tp_size}"


def _node(plan: LaunchPlan, index: int) -> str:
    return "localhost" if plan.kind == "local" else f"node {index}"


def tools_table(recipe: Recipe) -> Table:
    """The multi-turn settings of every domain with tools (docs/tools.md)."""
    table = Table(title="Tools (multi-turn episodes)", title_justify="left")
    columns = ("domain", "tools", "format", "max_turns", "max_tool_calls", "timeout_s", "episode tokens", "search")
    for column in columns:
        table.add_column(column, no_wrap=column != "search")
    for name, d in recipe.domains.items():
        if not d.tools:
            continue
        search = f"{d.search_corpus} (top {d.search_top_k})" if "search" in d.tools else "-"
        table.add_row(
            name,
            ", ".join(d.tools),
            d.tool_format if d.tool_instructions else f"{d.tool_format} (tools not listed in the prompt)",
            str(d.max_turns),
            str(d.max_tool_calls),
            f"{d.tool_timeout_s:g}",
            str(d.max_episode_tokens or recipe.rollout.max_new_tokens),
            search,
        )
    return table
