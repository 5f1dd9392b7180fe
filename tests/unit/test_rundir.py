"""The run directory's layout and its one atomic write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlvr import rundir
from rlvr.rundir import RunActive, RunDir, read_json, read_status, run_dir_of, write_atomic, write_json_atomic


def test_layout_names_on_disk_stay_put(tmp_path: Path) -> None:
    """Other tools, older runs and the sbatch script read these names: they must not drift."""
    paths = RunDir(tmp_path)
    got = {
        "recipe": paths.recipe, "status": paths.status, "metrics": paths.metrics, "events": paths.events,
        "checkpoints": paths.checkpoints, "server": paths.server(3), "judge": paths.judge,
        "log": paths.log("rollout-0"), "attempt": paths.attempt, "trainer_exit": paths.trainer_exit,
        "tensorboard": paths.tensorboard, "sbatch": paths.sbatch_script, "launch": paths.launch_recipe(2),
        "wandb": paths.wandb_id,
    }  # fmt: skip
    want = {
        "recipe": "resolved_recipe.json", "status": "status.json", "metrics": "metrics.jsonl",
        "events": "events.jsonl", "checkpoints": "checkpoints", "server": "servers/3.json",
        "judge": "servers/judge.url", "log": "logs/rollout-0.log", "attempt": "slurm/attempt.json",
        "trainer_exit": "slurm/trainer_exit.json", "tensorboard": "tensorboard", "sbatch": "job.sbatch",
        "launch": "recipes/launch-2.json", "wandb": "wandb_id",
    }  # fmt: skip
    assert {k: v.relative_to(tmp_path).as_posix() for k, v in got.items()} == want
    assert not any(tmp_path.iterdir())  # naming paths touches nothing


def test_run_dir_of_is_output_dir_slash_name_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    experiment = SimpleNamespace(output_dir="runs", name="exp")
    assert run_dir_of(experiment) == tmp_path / "runs" / "exp"
    assert RunDir.of(SimpleNamespace(experiment=experiment)).root == tmp_path / "runs" / "exp"


def test_write_atomic_creates_parents_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "status.json"
    write_json_atomic(target, {"state": "running"})
    write_atomic(target.with_name("latest"), "step_5", durable=True)
    assert read_status(tmp_path / "a" / "b") == {"state": "running"}
    assert (target.parent / "latest").read_text() == "step_5"
    assert sorted(p.name for p in target.parent.iterdir()) == ["latest", "status.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "status.json"
    write_json_atomic(target, {"state": "running"})

    def broken_replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(rundir.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_json_atomic(target, {"state": "finished"})
    assert json.loads(target.read_text()) == {"state": "running"}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_read_json_is_none_for_missing_or_partial_files(tmp_path: Path) -> None:
    assert read_json(tmp_path / "missing.json") is None
    (tmp_path / "half.json").write_text('{"state": "runn')
    assert read_json(tmp_path / "half.json") is None
    assert not RunDir(tmp_path).is_run()
    write_json_atomic(RunDir(tmp_path).status, {"state": "starting"})
    assert RunDir(tmp_path).is_run()


def test_a_second_lock_on_a_run_directory_names_the_holder(tmp_path: Path) -> None:
    holder = RunDir(tmp_path / "run").lock()
    with holder, pytest.raises(RunActive, match=rf"run active \(pid {os.getpid()} on "):
        RunDir(tmp_path / "run").lock()
    RunDir(tmp_path / "run").lock().release()  # released on exit: the next launch may take it


def test_a_lock_dies_with_its_holder(tmp_path: Path) -> None:
    holder = "from rlvr.rundir import RunDir; import sys, time; l = RunDir(sys.argv[1]).lock(); print(1, flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "1"
        with pytest.raises(RunActive, match=f"pid {proc.pid}"):
            RunDir(tmp_path).lock()
    finally:
        proc.kill()
        proc.wait()
    RunDir(tmp_path).lock().release()  # a killed launch leaves no stale lock


def test_finished_at_only_for_a_finished_run_that_reached_max_steps(tmp_path: Path) -> None:
    paths = RunDir(tmp_path)
    assert paths.finished_at(3) is None
    write_json_atomic(paths.status, {"state": "finished", "step": 3, "max_steps": 3})
    assert paths.finished_at(3) == 3
    assert paths.finished_at(5) is None  # max_steps raised: the run goes on
    write_json_atomic(paths.status, {"state": "stopped", "step": 3, "max_steps": 3})
    assert paths.finished_at(3) is None


def _complete(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text("{}")
    return folder


def test_find_checkpoint_resolves_what_a_user_names(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    assert rundir.find_checkpoint(run) is None  # nothing saved yet
    s9, s10 = _complete(ckpts / "step_9"), _complete(ckpts / "step_10")
    (ckpts / "step_11.tmp").mkdir()  # a save killed mid-way is never a checkpoint
    (ckpts / "step_12").mkdir()  # no meta.json: incomplete
    assert rundir.find_checkpoint(run) == s10  # by number, not by name: step_10 > step_9
    assert rundir.find_checkpoint(ckpts) == s10
    assert rundir.find_checkpoint(s9) == s9
    (ckpts / "latest").write_text("step_9")  # the pointer wins while it names a complete folder
    assert rundir.find_checkpoint(ckpts / "latest") == s9 and rundir.find_checkpoint(run) == s9
    (ckpts / "latest").write_text("step_12")
    assert rundir.find_checkpoint(run) == s10
    assert rundir.run_of_checkpoint(s9).recipe == (run / "resolved_recipe.json").resolve()
    assert rundir.step_of(ckpts / "step_11.tmp") is None and rundir.step_of(s10) == 10


QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.toml"


def launch(monkeypatch: pytest.MonkeyPatch, out: Path, *sets: str, resume: str = "auto"):
    """`rlvr launch` of the quickstart up to the point where it starts processes (stubbed here)."""
    from typer.testing import CliRunner

    import rlvr.cli as cli

    monkeypatch.setattr(cli, "_launch_local", lambda resolved, **_: 0)
    args = ["launch", str(QUICKSTART), "--no-dashboard", "--resume", resume]
    for item in (f"experiment.output_dir={json.dumps(str(out))}", *sets):
        args += ["--set", item]
    return CliRunner().invoke(cli.app, args)


def test_each_launch_keeps_its_recipe_and_a_rerun_says_what_changed(tmp_path: Path, monkeypatch) -> None:
    run = RunDir(tmp_path / "quickstart")
    first = launch(monkeypatch, tmp_path)
    assert first.exit_code == 0, first.output
    assert first.stdout == f"run directory: {run.root}\n"  # a new run: nothing to compare with
    assert run.launch_recipes() == [run.launch_recipe(1)]
    assert run.launch_recipe(1).read_text() == run.recipe.read_text()
    write_json_atomic(run.status, {"state": "stopped", "step": 2, "max_steps": 100, "started_at": 1.0})

    again = launch(monkeypatch, tmp_path, "trainer.lr=0.0001", "experiment.max_steps=120")
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines() == [
        f"run directory: {run.root}",
        "recipe changed since the last launch: experiment.max_steps 100 -> 120",
        "recipe changed since the last launch: trainer.lr 0.0002 -> 0.0001",
    ]
    assert run.launch_recipes() == [run.launch_recipe(1), run.launch_recipe(2)]
    assert json.loads(run.launch_recipe(1).read_text())["trainer"]["lr"] == 0.0002  # kept as it was
    assert run.launch_recipe(2).read_text() == run.recipe.read_text()  # the workers read the current one
    assert launch(monkeypatch, tmp_path, "trainer.lr=0.0001", "experiment.max_steps=120").stdout.count("\n") == 1

    # A run from before launches were kept (or written by `rlvr sbatch`): its recipe is kept now,
    # and a long list is cut short with where to read the rest.
    old = json.loads(run.recipe.read_text())
    old["experiment"]["seed"], old["rollout"]["n"] = 7, 2
    old["trainer"] |= {k: 1 for k in ("lr", "warmup_steps", "grad_clip", "weight_decay", "micro_batch_size")}
    old["algorithm"] |= {
        "kl_coef": 0.5,
        "clip_ratio_low": 0.1,
        "clip_ratio_high": 0.1,
        "ppo_epochs": 3,
        "mini_batches": 3,
    }
    write_atomic(run.recipe, json.dumps(old, indent=2))
    for path in run.launch_recipes():
        path.unlink()
    many = launch(monkeypatch, tmp_path)
    lines = many.stdout.splitlines()
    assert "recipe changed since the last launch: algorithm.kl_coef 0.5 -> 0.0" in lines
    assert len(lines) == 1 + 11 and all(x.startswith("recipe changed since the last launch: ") for x in lines[1:])
    assert lines[-1].startswith("recipe changed since the last launch: and ")
    assert lines[-1].endswith(f" more (the last launch's recipe: {run.launch_recipe(1)})")
    assert json.loads(run.launch_recipe(1).read_text()) == old and run.launch_recipes()[-1] == run.launch_recipe(2)


def test_a_fresh_start_is_a_new_wandb_run(tmp_path: Path, monkeypatch) -> None:
    run = RunDir(tmp_path / "quickstart")
    write_atomic(run.wandb_id, "abc123\n")
    assert launch(monkeypatch, tmp_path).exit_code == 0 and run.wandb_id.exists()  # a resume keeps it
    assert launch(monkeypatch, tmp_path, resume="none").exit_code == 0
    assert not run.wandb_id.exists()


def test_nothing_to_do_once_the_steps_are_trained(tmp_path: Path, monkeypatch) -> None:
    run = RunDir(tmp_path / "quickstart")
    write_json_atomic(run.status, {"state": "finished", "step": 4, "max_steps": 4})
    done = launch(monkeypatch, tmp_path, "experiment.max_steps=4")
    assert done.exit_code == 0 and done.stdout == f"{run.root}: already finished at 4/4; nothing to do\n"
    lower = launch(monkeypatch, tmp_path, "experiment.max_steps=2")  # not "finished at 4/2"
    assert lower.stdout == f"{run.root}: already finished at step 4 (experiment.max_steps = 2); nothing to do\n"
    write_json_atomic(run.status, {"state": "stopped", "step": 6, "max_steps": 8})
    saved = _complete(run.checkpoints / "step_6")  # a stopped run, rerun with fewer steps than it has
    past = launch(monkeypatch, tmp_path, "experiment.max_steps=5")
    assert past.stdout == f"{run.root}: checkpoint {saved} is at step 6 (experiment.max_steps = 5); nothing to do\n"
    assert launch(monkeypatch, tmp_path, "experiment.max_steps=8").stdout.startswith("run directory: ")
