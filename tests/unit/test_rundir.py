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
        "tensorboard": paths.tensorboard, "sbatch": paths.sbatch_script,
    }  # fmt: skip
    want = {
        "recipe": "resolved_recipe.json", "status": "status.json", "metrics": "metrics.jsonl",
        "events": "events.jsonl", "checkpoints": "checkpoints", "server": "servers/3.json",
        "judge": "servers/judge.url", "log": "logs/rollout-0.log", "attempt": "slurm/attempt.json",
        "trainer_exit": "slurm/trainer_exit.json", "tensorboard": "tensorboard", "sbatch": "job.sbatch",
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
