"""Chaos: the quickstart in `continue` mode while a seeded killer SIGKILLs the rollout server, the
judge, a trainer rank and the sandbox's fork server at random moments, and SIGSTOPs the server
(hung: the launcher's health deadline must find it). The run must reach max_steps with exit 0,
log every step once, leave every checkpoint loadable, say each fault in one events.jsonl line,
and (slow) end within noise of an undisturbed run with the same seed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.chaos import Killer

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"

# what each fault must have said in events.jsonl (one line each)
SAID = {
    "server": "rollout-0 died with code -9: killed by SIGKILL",
    "hang": "rollout-0 stopped answering /health for 6 s (hung): killed by SIGKILL",
    "judge": "judge died with code -9: killed by SIGKILL",
    "trainer": "trainer died with code 1: a rank (pid {pid}) was killed by SIGKILL",
    "agent": "trainer died with code -9: killed by SIGKILL",  # torchrun's agent, or its whole group
    "group": "trainer died with code -9: killed by SIGKILL",
    "stall": "trainer rank 0 stopped its heartbeat for 6 s (hung): killed by SIGKILL",
    "sandbox": "reward code: the sandbox's fork server had died and was restarted in step",
}


def launch(
    out: Path,
    *,
    steps: int,
    seed_faults: list[tuple[str, int]] | None,
    seed: int = 7,
    env: dict[str, str] | None = None,
    sets: list[str] | None = None,
) -> tuple[int, str, Killer]:
    sets = [
        f"experiment.output_dir={json.dumps(str(out))}", f"experiment.max_steps={steps}", "experiment.save_steps=3",
        "experiment.eval_steps=0", "sync.on_engine_failure=continue", "rollout.health_deadline_s=6",
        "rollout.server_restarts=8", *(sets or []),
    ]  # fmt: skip
    argv = [sys.executable, "-m", "rlvr.cli", "launch", str(QUICKSTART), "--no-dashboard"]
    proc = subprocess.Popen(
        argv + [x for s in sets for x in ("--set", s)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    killer = Killer(out / "quickstart", psutil.Process(proc.pid), seed=seed)
    thread = threading.Thread(
        target=killer.run, args=(seed_faults or [],), kwargs={"alive": lambda: proc.poll() is None}, daemon=True
    )
    thread.start()
    try:
        _, stderr = proc.communicate(timeout=1500)
    finally:
        if proc.poll() is None:
            proc.kill()
    thread.join(timeout=5)
    return proc.returncode, stderr, killer


def check_run(
    run_dir: Path, *, steps: int, rc: int, stderr: str, killer: Killer, faults: list[tuple[str, int]]
) -> list[dict]:
    assert rc == 0, stderr[-4000:]
    assert [(kind, step) for kind, step, _ in killer.done] == faults, killer.done  # every fault was delivered
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # every step logged exactly once
    loaded = load_every_checkpoint(run_dir)
    events = [json.loads(x)["message"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    for path, step in resumed(events):  # each restarted trainer resumed from the checkpoint it says
        assert Path(path).name == f"step_{step}" and loaded.get(step, step) == step, (path, step, loaded)
    for kind, _, pid in killer.done:  # one line per fault: as many lines of its kind as faults of its kind
        said = [e for e in events if e.startswith(SAID[kind].format(pid=pid))]
        faults_of_kind = sum(SAID[k] == SAID[kind] for k, _, _ in killer.done) if kind != "trainer" else 1
        assert len(said) == faults_of_kind, (kind, events)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    return rows


def load_every_checkpoint(run_dir: Path) -> dict[int, int]:
    """Each complete checkpoint of the run (`step_N/`, DCP), loaded for real into the quickstart's
    actor as a resume loads it (`load_checkpoint`: model, AdamW state, scheduler, the loop's extra
    state; DCP reshards the FSDP2 ranks' shards into one process): folder step -> the step its
    extra state holds. Each must have brought trained weights back, not the base's."""
    import torch

    from rlvr.recipe.load import load_recipe
    from rlvr.trainer.actor import Actor
    from rlvr.trainer.checkpoint import load_checkpoint

    recipe = load_recipe(QUICKSTART)
    trainer = recipe.trainer.model_copy(update={"strategy": "none"})
    steps: dict[int, int] = {}
    for meta_file in sorted((run_dir / "checkpoints").glob("step_*/meta.json")):
        meta = json.loads(meta_file.read_text())
        assert meta_file.parent.name == f"step_{meta['step']}" and meta["parts"] == ["actor"], meta
        actor = Actor.build(recipe.model, trainer, recipe.algorithm, total_steps=recipe.experiment.max_steps,
                            device=torch.device("cpu"))  # fmt: skip
        model = actor.trainer.model
        base = {name: p.detach().clone() for name, p in model.named_parameters()}
        extra = load_checkpoint(meta_file.parent, {"actor": actor.trainer})
        assert any(not torch.equal(base[name], p) for name, p in model.named_parameters()), meta_file.parent
        steps[int(meta["step"])] = int(extra["step"])
    assert all(k == v for k, v in steps.items()), steps
    return steps


def resumed(events: list[str]) -> list[tuple[str, int]]:
    """(checkpoint path, step) of every trainer's `resumed from PATH at step N` event, after checking
    that the launcher said each restart resumes from that checkpoint (`it resumes from checkpoint
    step_N`), one for one and in order."""
    said = [int(m.group(1)) for e in events if (m := re.search(r"it resumes from checkpoint step_(\d+)", e))]
    done = [(m.group(1), int(m.group(2))) for e in events if (m := re.match(r"^resumed from (.+) at step (\d+)$", e))]
    assert said == [step for _, step in done], (said, done, events)
    return done


def final_reward(rows: list[dict]) -> float:
    return sum(r["reward/mean"] for r in rows[-5:]) / 5


def test_a_run_survives_its_server_judge_sandbox_and_trainer_killed(tmp_path: Path) -> None:
    faults = [("server", 2), ("judge", 4), ("sandbox", 5), ("trainer", 7)]
    rc, stderr, killer = launch(tmp_path, steps=10, seed_faults=faults)
    check_run(tmp_path / "quickstart", steps=10, rc=rc, stderr=stderr, killer=killer, faults=faults)


def dying(tmp_path: Path, **when: str) -> dict[str, str]:
    """The env that starts `dying_server` in place of each rollout server (`RLVR_DYING_*` = `when`)."""
    return {
        "RLVR_SERVER_MODULE": "tests.integration.dying_server",
        "RLVR_DYING_MODEL": str(QUICKSTART.parent / "quickstart" / "policy"),
        "RLVR_DYING_MARK": str(tmp_path / "died"),
        **{f"RLVR_DYING_{key.upper()}": value for key, value in when.items()},
    }


def test_a_server_killed_in_the_middle_of_a_push_rejoins_and_the_run_finishes(tmp_path: Path) -> None:
    """The one server dies on the first bucket of push 3 (`dying_server`): the push waits for its
    restart, rebuilds the group for the new process and gives it every weight; nothing is lost."""
    rc, stderr, _ = launch(tmp_path, steps=6, seed_faults=None, env=dying(tmp_path, at_push="3"))
    assert rc == 0, stderr[-4000:]
    assert (tmp_path / "died").exists()  # it did die mid-push
    run_dir = tmp_path / "quickstart"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert rows[2]["sync/attempts"] >= 2 and rows[-1]["sync/engines"] == 1.0  # push 3 retried on the new process
    events = [json.loads(x)["message"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    died = [e for e in events if e.startswith("rollout-0 died with code -9: killed by SIGKILL")]
    assert len(died) == 1, events


def test_two_trainer_ranks_push_together_to_the_server_that_came_back_mid_wave(tmp_path: Path) -> None:
    """The one server dies while it generates wave 2 (`dying_server`) under two trainer ranks: the
    wave waits, the restarted server gets the current weights from a push both ranks join while the
    wave is collected (`RLLoop.rejoin_together`), and the wave finishes on it."""
    env = dying(tmp_path, at_generate="30")  # mid-wave: a wave of the quickstart is 16 group requests
    rc, stderr, _ = launch(tmp_path, steps=5, seed_faults=None, env=env, sets=["trainer.ranks=2"])
    assert rc == 0, stderr[-4000:]
    assert (tmp_path / "died").exists()
    run_dir = tmp_path / "quickstart"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 6))
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert "a rollout server is back after every server was lost: it gets version 1" in trainer_log


class TrainerWatch:
    """Samples, every 0.2 s, the live processes that run `rlvr.worker` on one run directory: the
    trainer's agent (torchrun) and its workers, each sample as (agents, workers). A process forked
    by one of them shows its parent's command line until it execs: counted as its parent."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = str(run_dir)
        self.samples: list[tuple[set[int], set[int]]] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def now(self) -> tuple[set[int], set[int]]:
        agents, workers, parents = set(), set(), {}
        for proc in psutil.process_iter(["cmdline", "status", "ppid"]):
            line = " ".join(proc.info["cmdline"] or [])
            if "rlvr.worker" in line and self.run_dir in line and proc.info["status"] != psutil.STATUS_ZOMBIE:
                (agents if "rlvr.trainer.torchrun" in line else workers).add(proc.pid)
                parents[proc.pid] = proc.info["ppid"]
        return {p for p in agents if parents[p] not in agents}, {p for p in workers if parents[p] not in workers}

    def _run(self) -> None:
        while not self.stopped.is_set():
            self.samples.append(self.now())
            time.sleep(0.2)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


def launch_one_trainer_at_a_time(
    tmp_path: Path, *, steps: int, faults: list[tuple[str, int]], sets: list[str] | None = None
) -> tuple[Path, TrainerWatch]:
    """`launch` with the trainer's processes watched: the run passes `check_run`, and never had two
    torchrun agents or two workers at once. The run directory and the watch, for more checks."""
    watch = TrainerWatch(tmp_path / "quickstart")
    try:
        rc, stderr, killer = launch(tmp_path, steps=steps, seed_faults=faults, sets=sets)
    finally:
        watch.stop()
    run_dir = tmp_path / "quickstart"
    check_run(run_dir, steps=steps, rc=rc, stderr=stderr, killer=killer, faults=faults)
    assert max(len(workers) for _, workers in watch.samples) == 1, "two trainer workers at once"
    assert max(len(agents) for agents, _ in watch.samples) == 1, "two torchrun agents at once"
    return run_dir, watch


@pytest.mark.slow  # three trainer restarts on the CPU quickstart: ~6 min
def test_a_killed_agent_a_killed_trainer_group_and_a_stopped_rank_leave_one_trainer(tmp_path: Path) -> None:
    """The agent SIGKILLed, a rank SIGSTOPped, the trainer's whole process group SIGKILLed: each
    time every process of that trainer goes (a worker, in a session of its own, with its agent; a
    stopped one once its heartbeat is silent past the deadline), never two trainers train at
    once, and the run finishes with every step logged once by the fourth trainer generation."""
    faults = [("agent", 2), ("stall", 3), ("group", 5)]
    run_dir, watch = launch_one_trainer_at_a_time(tmp_path, steps=7, faults=faults)
    started = {min(workers) for _, workers in watch.samples if workers}
    assert len(started) >= 4  # four trainers ran, one after another
    assert watch.now() == (set(), set())  # nothing of any trainer outlived the run
    assert json.loads((run_dir / "generation.json").read_text())["generation"] == 4


@pytest.mark.slow
def test_thirty_steps_of_chaos_end_where_an_undisturbed_run_ends(tmp_path: Path) -> None:
    faults = [
        ("server", 2), ("judge", 5), ("sandbox", 7), ("hang", 9), ("trainer", 12), ("server", 15),
        ("sandbox", 17), ("judge", 19), ("trainer", 22), ("hang", 25), ("server", 28),
    ]  # fmt: skip
    rc, stderr, killer = launch(tmp_path / "chaos", steps=32, seed_faults=faults)
    rows = check_run(tmp_path / "chaos" / "quickstart", steps=32, rc=rc, stderr=stderr, killer=killer, faults=faults)
    rc, stderr, _ = launch(tmp_path / "calm", steps=32, seed_faults=None)
    assert rc == 0, stderr[-3000:]
    calm = [json.loads(x) for x in (tmp_path / "calm" / "quickstart" / "metrics.jsonl").read_text().splitlines()]
    assert abs(final_reward(rows) - final_reward(calm)) < 0.1, (final_reward(rows), final_reward(calm))
