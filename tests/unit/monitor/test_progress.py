"""Plain progress lines for a launch whose output is a file, and the launcher's failed status."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlvr.monitor.metrics import RunRecorder, mark_failed, mark_stopped
from rlvr.monitor.progress import PlainProgress, final_line, follow, resumed_from, step_line
from rlvr.rundir import read_status


def test_a_step_line_names_rewards_eval_kl_and_time() -> None:
    row = {"step": 3, "reward/math/mean": 0.5, "reward/code/mean": 0.25, "reward/mean": 0.4, "kl": 0.00123}
    row |= {"eval/reward/math/mean": 0.75, "time/step": 4.14, "reward/math/accuracy": 1.0}
    assert step_line(row, max_steps=10) == (
        "step 3/10  reward code 0.250 math 0.500  eval math 0.750  kl 0.0012  4.1 s/step"
    )


def test_a_step_line_says_failed_verdicts_and_skipped_rows() -> None:
    row = {"step": 2, "reward/math/mean": 0.5, "reward/math/count": 30.0, "reward/math/failed": 10.0}
    row |= {"reward/qa/count": 0.0, "reward/qa/failed": 8.0, "data/qa/dropped": 3.0, "data/math/dropped": 0.0}
    assert step_line(row, max_steps=4) == "step 2/4  reward math 0.500 (10 failed) qa -- (8 failed)  skipped rows qa 3"


def test_follow_prints_each_step_once_including_the_last_rows(tmp_path: Path) -> None:
    recorder = RunRecorder(tmp_path, max_steps=3)
    printed: list[str] = []
    calls = iter([False, False, True])

    def stop() -> bool:
        done = next(calls)
        recorder.log(len(printed) + 1, {"reward/a/mean": 1.0})  # a step lands between polls
        return done

    follow(tmp_path, stop=stop, emit=printed.append, poll_s=0)
    assert [line.split("  ")[0] for line in printed] == ["step 1/3", "step 2/3", "step 3/3"]


def test_final_line_says_finished_or_how_to_resume(tmp_path: Path) -> None:
    recorder = RunRecorder(tmp_path, max_steps=5)
    recorder.log(5, {})
    recorder.close("finished")
    assert final_line(tmp_path, code=0) == f"finished at 5/5; results in {tmp_path}"
    recorder = RunRecorder(tmp_path / "b", max_steps=5)
    recorder.log(2, {})
    recorder.close("stopped")
    assert final_line(tmp_path / "b", code=130) == "stopped at step 2/5: rerun the same command to resume"


def test_mark_failed_ends_a_start_that_never_ran(tmp_path: Path) -> None:
    RunRecorder(tmp_path, max_steps=5)  # status "starting": the trainer died before step 1
    mark_failed(tmp_path, "trainer exited with code 1: DataError: x:7: bad (log: logs/trainer.log)")
    status = read_status(tmp_path)
    assert status is not None and status["state"] == "failed" and status["max_steps"] == 5
    assert status["error"].startswith("trainer exited")
    event = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert event["level"] == "error" and "DataError" in event["message"]
    mark_failed(tmp_path / "fresh", "judge died", max_steps=7)  # no status.json yet
    fresh = read_status(tmp_path / "fresh")
    assert fresh is not None and fresh["state"] == "failed" and fresh["max_steps"] == 7
    assert "failed at step 0/7" in final_line(tmp_path / "fresh", code=1)


def test_mark_stopped_keeps_the_trainers_own_ending(tmp_path: Path) -> None:
    killed = RunRecorder(tmp_path / "killed", max_steps=5)
    killed.log(2, {})  # "running" at step 2, then killed mid-save: it never wrote its ending
    mark_stopped(tmp_path / "killed")
    status = read_status(tmp_path / "killed")
    assert status is not None and status["state"] == "stopped" and status["step"] == 2 and "ended_at" in status
    finished = RunRecorder(tmp_path / "finished", max_steps=5)
    finished.log(5, {})
    finished.close("finished")  # it finished while the stop was on its way
    mark_stopped(tmp_path / "finished")
    assert (read_status(tmp_path / "finished") or {})["state"] == "finished"
    mark_stopped(tmp_path / "never")  # nothing started: nothing to write
    assert not (tmp_path / "never").exists()


def test_final_line_of_a_run_stopped_before_its_trainer_wrote_anything(tmp_path: Path) -> None:
    assert final_line(tmp_path, code=130, max_steps=100) == "stopped at step 0/100: rerun the same command to resume"


def test_a_resumed_run_says_so_and_prints_only_the_steps_it_runs(tmp_path: Path) -> None:
    """The rows and events of earlier launches are not printed again as if they had just run."""
    before = RunRecorder(tmp_path, max_steps=6)
    for step in range(1, 6):  # step 5 was logged, then the run was killed before saving it
        before.log(step, {"reward/a/mean": 0.5})
    before.event(f"resumed from {tmp_path}/checkpoints/step_2 at step 2", level="info")  # an older resume
    before.close("stopped")
    printed: list[str] = []
    progress = PlainProgress(tmp_path, emit=printed.append)  # the launcher makes it before the trainer starts
    progress.poll()
    assert printed == []
    trainer = RunRecorder(tmp_path, max_steps=6)  # the relaunched trainer, as rlvr.loop's resume() says it
    trainer.event(f"resumed from {tmp_path}/checkpoints/step_4 at step 4", level="info")
    progress.poll()
    assert trainer.rewind(4) == 1  # step 5 runs again: logged once
    trainer.log(5, {"reward/a/mean": 0.6})
    trainer.log(6, {"reward/a/mean": 0.7})
    trainer.close("finished")
    progress.poll()
    assert printed == [
        f"resumed from step_4 ({tmp_path}/checkpoints/step_4)",
        "step 5/6  reward a 0.600",
        "step 6/6  reward a 0.700",
    ]


def test_the_resume_line_reads_the_event_the_loop_writes() -> None:
    """`resumed_from` parses rlvr.loop's event; this pins the two together (loop.py is not imported:
    torch)."""
    loop_source = (Path(__file__).resolve().parents[3] / "rlvr" / "loop.py").read_text()
    assert 'f"resumed from {path} at step {self.step}"' in loop_source
    assert resumed_from({"message": "resumed from /r/checkpoints/step_12 at step 12"}) == (12, "/r/checkpoints/step_12")
    assert resumed_from({"message": "checkpoint saved: step_12"}) is None


def test_the_step_line_says_the_wall_time_between_steps(tmp_path: Path) -> None:
    """`time/step` leaves out the previous step's logging and checkpoint: a reader's s/step is the
    time from one step's line to the next."""
    recorder = RunRecorder(tmp_path, max_steps=3)
    printed: list[str] = []
    progress = PlainProgress(tmp_path, emit=printed.append)
    recorder.log(1, {"time/step": 0.1})
    progress.poll()
    time.sleep(0.5)
    recorder.log(2, {"time/step": 0.1})
    progress.poll()
    assert printed[0].endswith("0.1 s/step")  # the first: nothing to measure from
    assert float(printed[1].split()[-2]) >= 0.5, printed
