"""The launcher's one-line cause of a child's failure, read from real log shapes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlvr.launch.failure import CLEAN_EXITS, failure, root_cause, trainer_crashed
from rlvr.process import Child

TORCHRUN_LOG = """$ torchrun --nproc-per-node 1 -m rlvr.worker --run-dir runs/q
Traceback (most recent call last):
  File "/x/rlvr/worker.py", line 3, in <module>
    raise DataError("data/x.jsonl:7: invalid JSON")
rlvr.data.base.DataError: data/x.jsonl:7: invalid JSON
E1203 02:44:38.679000 19829 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
rlvr.worker FAILED
------------------------------------------------------------
Root Cause (first observed failure):
  exitcode  : 1 (pid: 19834)
============================================================
"""


def test_the_first_ranks_exception_not_torchruns_banner() -> None:
    assert root_cause(TORCHRUN_LOG) == "DataError: data/x.jsonl:7: invalid JSON"


def test_a_multi_line_message_is_joined_and_capped() -> None:
    log = "Traceback (most recent call last):\n  File 'x'\nValueError: first\nsecond\n\nlater noise\n"
    assert root_cause(log) == "ValueError: first second"
    long = "Traceback (most recent call last):\n  File 'x'\nValueError: " + "y" * 1000 + "\n"
    assert len(root_cause(long)) == 400 and root_cause(long).endswith("...")


def test_an_exit_with_a_message_is_the_last_words_before_torchrun() -> None:
    log = "$ torchrun ...\nloading\nmodel.path must name a folder with a tokenizer\nE1203 00:00:00.0 1 api.py:1] failed (exitcode: 1)\n"
    assert root_cause(log) == "model.path must name a folder with a tokenizer"
    assert root_cause("") == "no output"


def test_a_chained_exception_reports_the_first_one() -> None:
    log = (
        "Traceback (most recent call last):\n  File 'a'\nKeyError: 'step'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File 'b'\nRuntimeError: wrapped\n"
    )
    assert root_cause(log) == "KeyError: 'step'"


def test_a_pydantic_error_keeps_what_is_wrong() -> None:
    """vLLM's config errors are pydantic's: the reason is on the indented line after the exception."""
    log = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, User-specified max_model_len (100000) is greater than the derived max_model_len\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n"
    )
    assert root_cause(log) == (
        "ValidationError: 1 validation error for ModelConfig Value error, User-specified max_model_len (100000) "
        "is greater than the derived max_model_len"
    )


KILLED_RANK_LOG = """$ python -m rlvr.trainer.torchrun --nproc-per-node=2 -m rlvr.worker --run-dir runs/q
E1205 16:36:32.653000 11484 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0
rlvr.worker FAILED
-------------------------------------------------------
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 11497)  (SIGTERM)
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 11496)  (SIGKILL)
=======================================================
"""


def started(tmp_path: Path, log_text: str, code: int) -> Child:
    """A finished child whose log holds `log_text` (earlier starts of it above, as a restart appends)."""
    log = tmp_path / "trainer.log"
    log.write_text(log_text)
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return Child("trainer", proc, log)


def test_a_rank_killed_from_outside_is_named_not_the_ranks_torchrun_stopped(tmp_path: Path) -> None:
    earlier = TORCHRUN_LOG  # the first start's failure, above in the same log: not this one's cause
    line = str(failure(started(tmp_path, earlier + KILLED_RANK_LOG, 1), "died with code 1"))
    assert (
        line == f"trainer died with code 1: a rank (pid 11496) was killed by SIGKILL (log: {tmp_path / 'trainer.log'})"
    )


def test_only_a_crash_is_restarted_never_a_stop_the_trainer_declared(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    log.write_text(KILLED_RANK_LOG)
    assert trainer_crashed(1, log, progressed=False)  # a rank died of a signal
    assert trainer_crashed(-9, None, progressed=False)  # the trainer itself was
    assert trainer_crashed(1, None, progressed=True)  # an exception after it trained a step
    log.write_text(TORCHRUN_LOG)
    assert not trainer_crashed(1, log, progressed=False)  # a start-up error: a restart would repeat it
    for code in CLEAN_EXITS:  # finished, stopped, stopped for a failure it stated
        assert not trainer_crashed(code, None, progressed=True)
