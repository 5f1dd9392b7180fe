"""A seeded killer for the chaos tests: finds a run's processes by what they are and kills one.

Each fault is (kind, when): `when` is a step the run must have logged, plus a seeded delay so the
kill lands at a random moment of the next step (mid-generation, mid-reward, mid-push). Kinds:
`server` (SIGKILL a rollout server), `judge` (SIGKILL the judge server), `trainer` (SIGKILL a
trainer rank: the worker under torchrun), `agent` (SIGKILL torchrun's agent, the first process
whose command line runs `rlvr.worker`: its workers, in sessions of their own, must die with it),
`group` (SIGKILL the trainer's whole process group, the agent's: the workers are not in it),
`sandbox` (SIGKILL the code sandbox's fork server), `hang` (SIGSTOP a rollout server: the
launcher's health deadline must find it hung), `stall` (SIGSTOP a trainer rank: nothing dies, and
its silent heartbeat must tell it from a slow one).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass
class Killer:
    run_dir: Path
    launcher: psutil.Process
    seed: int
    done: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, after step, pid)

    def steps(self) -> int:
        metrics = self.run_dir / "metrics.jsonl"
        return len([x for x in metrics.read_text().splitlines() if x.strip()]) if metrics.exists() else 0

    def processes(self) -> list[psutil.Process]:
        try:
            return self.launcher.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def find(self, kind: str) -> psutil.Process | None:
        """The live process a fault of `kind` hits."""
        for proc in self.processes():
            try:
                line = " ".join(proc.cmdline())
                if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED):
                    continue
            except psutil.Error:
                continue
            server = "rlvr.cli serve" in line or "vllm.entrypoints" in line  # rlvr serve, or vLLM's API server
            if kind in ("server", "hang") and server and f"--port {self._port('0')}" in line:
                return proc
            if kind == "judge" and "rlvr.cli serve" in line and f"--port {self._port('judge')}" in line:
                return proc
            if kind in ("trainer", "stall") and "rlvr.worker" in line and "rlvr.trainer.torchrun" not in line:
                return proc
            if kind in ("agent", "group") and "rlvr.worker" in line and "rlvr.trainer.torchrun" in line:
                return proc
            if kind == "sandbox" and "zygote.py" in line and "bwrap" not in line:
                return proc
        return None

    def _port(self, which: str) -> str:
        if which == "judge":
            path = self.run_dir / "servers" / "judge.url"
            url = path.read_text().strip() if path.exists() else ""
        else:
            path = self.run_dir / "servers" / f"{which}.json"
            url = json.loads(path.read_text())["url"] if path.exists() else ""
        return url.rsplit(":", 1)[-1] if url else "-"

    def run(self, faults: list[tuple[str, int]], *, alive: callable, timeout_s: float = 1200) -> None:
        """Deliver each fault once the run has logged its step; `alive()` False stops early."""
        rng = random.Random(self.seed)
        deadline = time.monotonic() + timeout_s
        for kind, step in faults:
            while self.steps() < step:
                if not alive() or time.monotonic() > deadline:
                    return
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 1.5))
            proc = None
            while proc is None and alive() and time.monotonic() < deadline:
                proc = self.find(kind)
                if proc is None:
                    time.sleep(0.2)
            if proc is None:
                return
            if kind == "group":
                os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGSTOP if kind in ("hang", "stall") else signal.SIGKILL)
            self.done.append((kind, step, proc.pid))
