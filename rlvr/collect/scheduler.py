"""When waves run: the staleness gate admits wave s once the engines serve version >= s - k
(k = rollout.max_staleness), and a wave's refills draw only after every earlier wave's are final,
so the prompts a step trains follow the seed, never timing (`WaveDraws`, docs/async.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.data.adaptive import GroupOutcome
from rlvr.data.mixture import WaveDraws
from rlvr.recipe.schema import Recipe
from rlvr.rewards.budget import StepFailures
from rlvr.types import Group, Sample


@dataclass
class Wave:
    """One step's groups as they finish; `task` resolves when every round is done."""

    step: int
    prompts: list[Sample]
    kept: list[Group] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)  # monitor.log_samples episodes
    failures: dict[str, StepFailures] = field(default_factory=dict)  # per domain, every round
    dropped: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # (row id, prompt tokens)
    outcomes: list[GroupOutcome] = field(default_factory=list)  # every judged group, for an observing mixture
    generated_tokens: int = 0  # every round's, filtered and failed groups included
    started_at: float = field(default_factory=time.perf_counter)
    task: asyncio.Task[None] | None = None


Refill = Callable[[int, Sequence[str]], Awaitable[list[Sample]]]
"""`refill(step, domains)`: one more prompt per entry of `domains` for wave `step`."""

Collect = Callable[[Wave, Refill], Awaitable[None]]
"""`collect(wave, refill)`: run the wave's rounds to the end, refilling through `refill`."""


class WaveScheduler:
    """Admits waves on `loop` as the gate allows and runs each through `collect`; `weights_ready`
    is closed while a weight push runs (episodes wait at it)."""

    def __init__(
        self,
        recipe: Recipe,
        *,
        draws: WaveDraws,
        loop: asyncio.AbstractEventLoop,
        weights_ready: asyncio.Event,
        collect: Collect,
    ) -> None:
        self.recipe = recipe
        self.draws = draws
        self.loop = loop
        self.weights_ready = weights_ready
        self.collect = collect
        self.max_staleness = recipe.rollout.max_staleness
        self.version = 0  # the weights the engines serve (trainer steps applied)
        self.waves: dict[int, Wave] = {}  # admitted, not yet taken
        self.next_wave = 0
        self._refills_final: dict[int, asyncio.Event] = {}  # per wave: its refill draws are done

    async def open_gate(self, version: int, *, first_wave: int | None = None) -> None:
        """The engines serve `version`: admit every wave the bound now allows (from `first_wave`)."""
        self.version = version
        if first_wave is not None:
            self.next_wave = first_wave
        self.weights_ready.set()
        last = self.recipe.experiment.max_steps - 1
        while self.next_wave <= min(version + self.max_staleness, last):
            self.admit(self.next_wave)
            self.next_wave += 1

    async def close_gate(self) -> None:
        self.weights_ready.clear()

    def admit(self, step: int) -> None:
        """Draw wave `step`'s quota and start its rounds."""
        wave = Wave(step=step, prompts=self.draws.quota(step))
        wave.metrics.update(self.draws.mixture.mix_metrics())  # the shares and pools this quota was drawn with
        self._refills_final[step] = asyncio.Event()
        wave.task = self.loop.create_task(self.run_wave(wave))
        self.waves[step] = wave

    async def run_wave(self, wave: Wave) -> None:
        try:
            await self.collect(wave, self.refill)
        finally:
            self.draws.finish(wave.step, wave.outcomes)
            event = self._refills_final.get(wave.step)
            if event is not None:
                event.set()

    async def refill(self, step: int, domains: Sequence[str]) -> list[Sample]:
        """One prompt per entry of `domains` for wave `step`, once every earlier wave's refills are final."""
        for earlier in [event for s, event in self._refills_final.items() if s < step]:
            await earlier.wait()
        return [s for domain in domains for s in self.draws.refill(step, domain, 1)]

    async def finished(self, step: int) -> tuple[Wave, float]:
        """Wave `step` once all its rounds are done (admitted now if it was not), and the seconds
        waited for it; it leaves the schedule."""
        if step not in self.waves:  # a caller without start/resume: admit it now
            await self.open_gate(max(self.version, step - self.max_staleness), first_wave=step)
        wave = self.waves.pop(step)
        start = time.perf_counter()
        assert wave.task is not None
        await wave.task
        waited = time.perf_counter() - start
        self.draws.forget(step)  # step's own mark stays: a stop before training it resumes it
        for old in [s for s in self._refills_final if s < step]:
            del self._refills_final[old]
        return wave, waited

    async def cancel(self) -> None:
        """Cancel every wave admitted and not taken, and wait until they stopped."""
        for wave in self.waves.values():
            if wave.task is not None:
                wave.task.cancel()
        await asyncio.gather(*(w.task for w in self.waves.values() if w.task is not None), return_exceptions=True)
        self.waves.clear()
