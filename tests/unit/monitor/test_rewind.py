"""A rerun logs every step once: the steps a killed attempt logged after its checkpoint go."""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.monitor.metrics import RunRecorder


def steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_rewind_drops_rows_after_the_checkpoint_and_a_torn_last_line(tmp_path: Path) -> None:
    first = RunRecorder(tmp_path, max_steps=5)
    for step in (1, 2, 3):
        first.log(step, {"loss": 1.0})
        first.samples([{"step": step, "domain": "math", "completion": "x"}])
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "ti')  # the kill landed mid-write
    again = RunRecorder(tmp_path, max_steps=5)
    assert again.rewind(2) == 2
    again.log(3, {"loss": 0.5})
    again.samples([{"step": 3, "domain": "math", "completion": "y"}])
    again.close()
    assert steps(tmp_path / "metrics.jsonl") == [1, 2, 3]
    assert steps(tmp_path / "samples.jsonl") == [1, 2, 3]
    assert json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[-1])["completion"] == "y"


def test_rewind_to_zero_empties_and_nothing_to_drop_is_zero(tmp_path: Path) -> None:
    rec = RunRecorder(tmp_path, max_steps=5)
    assert rec.rewind(0) == 0
    rec.log(1, {"loss": 1.0})
    assert rec.rewind(1) == 0
    assert rec.rewind(0) == 1
    rec.log(1, {"loss": 2.0})
    rec.close()
    assert [json.loads(x)["loss"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [2.0]


def test_a_tail_carries_on_after_a_rewind_that_the_file_outgrew_before_it_looked(tmp_path: Path) -> None:
    from rlvr.monitor.metrics import JsonlTail

    first = RunRecorder(tmp_path, max_steps=9)
    for step in (1, 2, 3, 4, 5):
        first.log(step, {"loss": 1.0})
    tail = JsonlTail(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in tail.read_new()] == [1, 2, 3, 4, 5]
    again = RunRecorder(tmp_path, max_steps=9)
    assert again.rewind(3) == 2
    for step in (4, 5, 6, 7):  # the file is longer than before by the time the tail reads again
        again.log(step, {"loss": 0.5})
    assert [(r["step"], r["loss"]) for r in tail.read_new()] == [(4, 0.5), (5, 0.5), (6, 0.5), (7, 0.5)]
    assert tail.read_new() == []
