"""The rich live dashboard, fed only by the run directory (see metrics.py).

`rlvr launch` shows it while its children train; `rlvr monitor RUN_DIR` attaches to a
running or finished run from any terminal that can read the directory. It renders: a
step progress bar with ETA, a per-domain reward table (latest, first, change, accuracy,
response length), a tools table for domains that call tools (calls per episode, share of
episodes calling, turns, errors, timeouts, latency), throughput and the step-time split,
and the last warnings/errors. A resumed run says so in the header (`resumed from step_4`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from rlvr.monitor.metrics import JsonlTail, reward_domains
from rlvr.monitor.progress import resumed_from
from rlvr.rundir import DONE_STATES, RunDir, read_status
from rlvr.types import GROUP_ENDS

# The step's critical path: waiting for the rollout wave, training, pushing weights (their shares add
# up to about the step). Generation and rewards run beside them, shown in the pipeline table.
TIME_KEYS = {"wait": "wait_rollout", "train": "train", "sync": "sync"}


class RunView:
    """Everything the dashboard shows, folded incrementally from the run directory."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.metrics_tail = JsonlTail(RunDir(self.run_dir).metrics)
        self.events_tail = JsonlTail(RunDir(self.run_dir).events)
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.events: list[dict[str, Any]] = []
        self.status: dict[str, Any] = {}
        self.step_times: list[float] = []
        self.resumed: tuple[int, float] | None = None  # (step, when) of the last `resumed from` event
        self.launched_at: float | None = None  # when this launch began (a launcher's view only)
        self.asynchronous = True  # the recipe's max_staleness > 0 (read by refresh)

    def refresh(self) -> None:
        for row in self.metrics_tail.read_new():
            for key, value in row.items():
                self.first.setdefault(key, value)
            self.last.update(row)
            if "time/step" in row:
                self.step_times.append(row["time/step"])
        new = self.events_tail.read_new()
        for event in new:
            resumed = resumed_from(event)
            if resumed is not None:
                self.resumed = (resumed[0], float(event.get("time") or 0))
        self.events = (self.events + new)[-5:]
        self.status = read_status(self.run_dir) or self.status
        self.asynchronous = _asynchronous(self.run_dir)  # once per refresh, not per table cell

    def since_launch(self) -> None:
        """A launcher's view: a status written before this launch (a resumed run's `stopped`) is
        an earlier launch's word, so the run is not done until this launch's trainer says so."""
        self.launched_at = RunDir(self.run_dir).launched_at()

    def _stale(self) -> bool:
        started = self.status.get("started_at")
        return self.launched_at is not None and started is not None and float(started) < self.launched_at

    @property
    def done(self) -> bool:
        return self.status.get("state") in DONE_STATES and not self._stale()

    def resumed_step(self) -> int | None:
        """The checkpoint step the current trainer resumed from (its event is newer than its start)."""
        if self.resumed is None or self._stale():
            return None
        step, when = self.resumed
        return step if when >= float(self.status.get("started_at") or 0) else None

    def domains(self) -> list[str]:
        return reward_domains(self.last)

    def tool_domains(self) -> list[str]:
        """Domains whose episodes run tools, as named by `tools/<domain>/calls_per_episode`."""
        return sorted(k.split("/")[1] for k in self.last if k.startswith("tools/") and k.endswith("/calls_per_episode"))

    def render(self) -> Group:
        tools = [self._tools()] if self.tool_domains() else []
        return Group(self._header(), self._domain_table(), *tools, self._throughput(), self._pipeline(), self._events())

    def _header(self) -> Panel:
        step = int(self.last.get("step") or self.status.get("step") or 0)
        total = int(self.status.get("max_steps", 0) or 1)
        state = "starting" if self._stale() else self.status.get("state", "waiting")
        recent = self.step_times[-10:]
        eta = (sum(recent) / len(recent)) * (total - step) if recent and state == "running" else None
        resumed = self.resumed_step()
        line = Text.assemble(
            (f"{self.status.get('name', self.run_dir.name)}  ", "bold"),
            (f"[{state}]  ", _state_style(state)),
            f"step {step}/{total}  ",
            (f"resumed from step_{resumed}  ", "cyan") if resumed is not None else "",
            f"ETA {_duration(eta)}" if eta is not None else "",
        )
        bar = ProgressBar(total=total, completed=step, width=60)
        return Panel(Group(line, bar), title="rlvr", border_style="cyan")

    def _domain_table(self) -> Table:
        table = Table(title="Rewards by domain", title_justify="left", expand=False)
        # the adaptive mix's current shares and the difficulty pools' resting prompts, when enabled
        shares = any(key.startswith("mix/") for key in self.last)
        pools = any(key.startswith("pool/") for key in self.last)
        columns = ["domain", "reward", "first", "change", "accuracy", "failed", "no spread", "resp len", "eval"]
        columns += ["share"] * shares + ["resting"] * pools
        for column in columns:
            table.add_column(column, justify="left" if column == "domain" else "right")
        for name in self.domains():
            extra = [_num(self.last.get(f"mix/{name}"))] * shares
            solved, failed_ = (self.last.get(f"pool/{name}/resting_{v}") for v in ("solved", "failed"))
            resting = f"{int(solved)} ok / {int(failed_)} wrong" if solved is not None and failed_ is not None else "-"
            extra += [resting] * pools
            now, first = self.last.get(f"reward/{name}/mean"), self.first.get(f"reward/{name}/mean")
            change = now - first if now is not None and first is not None else None
            failed = int(self.last.get(f"reward/{name}/failed") or 0)  # could not judge: not trained on
            table.add_row(
                name,
                _num(now),
                _num(first),
                Text(f"{change:+.3f}", style="green" if change >= 0 else "red") if change is not None else "-",
                _num(self.last.get(f"reward/{name}/accuracy")),
                Text(str(failed), style="bold red") if failed else "0",
                _pct(self.last.get(f"zero_spread/{name}")),
                _num(self.last.get(f"response_len/{name}"), digits=1),
                _num(self.last.get(f"eval/reward/{name}/mean")),
                *extra,
            )
            for tag in self._benchmarks(name):  # one line per eval benchmark (row tag) of this domain
                mean = self.last.get(f"eval/{name}/{tag}/mean")
                table.add_row(
                    Text(f"  {tag}", style="dim"), "", "", "", "", "", "", "", _num(mean), *[""] * (len(columns) - 9)
                )
        return table

    def _tools(self) -> Table:
        """Per tool domain: how often episodes call (latest, and the change since the first step:
        the number RL should move), turns, and what went wrong in the last step."""
        table = Table(title="Tools", title_justify="left")
        for column in ("domain", "calls/ep", "call rate", "change", "turns", "errors", "timeouts", "latency"):
            table.add_column(column, justify="left" if column == "domain" else "right")
        for name in self.tool_domains():
            key = f"tools/{name}/"
            now, first = self.last.get(key + "call_rate"), self.first.get(key + "call_rate")
            change = now - first if now is not None and first is not None else None
            latency = self.last.get(key + "latency_s")
            table.add_row(
                name,
                _num(self.last.get(key + "calls_per_episode"), digits=2),
                _pct(now),
                Text(f"{100 * change:+.0f} pt", style="green" if change >= 0 else "red") if change is not None else "-",
                _num(self.last.get(f"turns/{name}"), digits=2),
                _num(self.last.get(key + "errors"), digits=0),
                _num(self.last.get(key + "timeouts"), digits=0),
                f"{1000 * latency:.0f} ms" if latency is not None else "-",
            )
        return table

    def _benchmarks(self, domain: str) -> list[str]:
        prefix = f"eval/{domain}/"
        return sorted(
            {k[len(prefix) : -len("/mean")] for k in self.last if k.startswith(prefix) and k.endswith("/mean")}
        )

    def _throughput(self) -> Table:
        table = Table(title="Throughput", title_justify="left", show_header=True)
        table.add_column("tokens/s", justify="right")
        table.add_column("step s", justify="right")
        for label in TIME_KEYS:
            table.add_column(label, justify="right")
        for key in ("kl", "entropy", "clip_frac"):
            table.add_column(key, justify="right")
        step_time = self.last.get("time/step")
        split = [
            f"{self.last[f'time/{k}']:.2f} ({100 * self.last[f'time/{k}'] / step_time:.0f}%)"
            if f"time/{k}" in self.last and step_time
            else "-"
            for k in TIME_KEYS.values()
        ]
        table.add_row(
            _num(self.last.get("throughput/tokens_per_s"), digits=0),
            _num(step_time, digits=2),
            *split,
            _num(self.last.get("kl"), digits=4),
            _num(self.last.get("entropy")),
            _num(self.last.get("clip_frac")),
        )
        return table

    def _pipeline(self) -> Table:
        """Where every started group ended (trained/stale/filtered/failed/cancelled) and how long
        the step's wave took; asynchronous runs add how idle generation was, how stale the trained
        samples were and the off-policy correction. A synchronous run leaves those out: its
        generation waits for training by design, and "gen idle 92%" would read as a fault."""
        last = self.last
        counts = "/".join(f"{int(last[f'groups/{k}'])}" if f"groups/{k}" in last else "-" for k in GROUP_ENDS)
        cells = {"wave s": _num(last.get("time/rollout"), digits=2)}
        if self.asynchronous:
            cells |= {
                "gen idle": _pct(last.get("rollout/generation_idle_frac")),
                "stale max": _num(last.get("rollout/staleness_max"), digits=0),
                "stale mean": _num(last.get("rollout/staleness_mean"), digits=2),
                "partial": _pct(last.get("rollout/partial_frac")),
            }
        cells["groups t/s/filt/fail/c"] = counts
        if self.asynchronous:
            cells |= {
                "mismatch kl": _num(last.get("mismatch_kl"), digits=4),
                "is weight": _num(last.get("tis_weight_mean")),
            }
        table = Table(title="Rollout pipeline" if self.asynchronous else "Rollout", title_justify="left")
        for column in cells:
            table.add_column(column, justify="right")
        table.add_row(*cells.values())
        return table

    def _events(self) -> Panel:
        if not self.events:
            return Panel(Text("no warnings", style="dim"), title="last events", border_style="dim")
        lines = [
            Text(
                f"{time.strftime('%H:%M:%S', time.localtime(e['time']))} {e['level']}: {e['message']}",
                style="red" if e.get("level") == "error" else "yellow",
            )
            for e in self.events
        ]
        return Panel(Group(*lines), title="last events", border_style="yellow")


def watch(
    run_dir: str | Path,
    *,
    console: Console | None = None,
    once: bool = False,
    refresh_s: float = 1.0,
    stop: Callable[[], bool] | None = None,
) -> RunView:
    """Render until the run ends (or `stop()` says so); `once` prints one snapshot."""
    from rich.live import Live

    view = RunView(run_dir)
    view.refresh()
    if stop is not None:  # a launcher's: it says when the run is over; an old ending is not this one
        view.since_launch()
    if once:
        snapshot = view.render()
        # A file or a pipe has no width: rich assumes 80 and cuts cells (`clip_fr…`); size it to the widest table.
        console = console or Console(width=None if sys.stdout.isatty() else _natural_width(snapshot))
        console.print(snapshot)
        return view
    console = console or Console()
    with Live(view.render(), console=console, refresh_per_second=4, transient=False) as live:
        while True:
            view.refresh()
            live.update(view.render())
            if view.done or (stop is not None and stop()):
                break
            time.sleep(refresh_s)
    return view


def _asynchronous(run_dir: Path) -> bool:
    """Whether the run's recipe overlaps generation with training (max_staleness > 0); an
    unreadable recipe counts as asynchronous (show everything rather than hide it)."""
    try:
        recipe = json.loads(RunDir(run_dir).recipe.read_text())
        return int(recipe["rollout"]["max_staleness"]) > 0
    except (OSError, ValueError, KeyError, TypeError):
        return True


def _natural_width(group: Group) -> int:
    """The width at which no table of `group` cuts a cell (at least 80 columns)."""
    wide = Console(width=1000)
    tables = [r for r in group.renderables if isinstance(r, Table)]
    return max([80, *(wide.measure(t).maximum for t in tables)])


def _num(value: float | None, *, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{sec:02d}s"


def _state_style(state: str) -> str:
    return {"running": "green", "finished": "bold green", "failed": "bold red"}.get(state, "yellow")
