"""torchrun that stays quiet when its workers stop on their own terms: `python -m rlvr.trainer.torchrun ARGS`.

The arguments are torchrun's (`python -m torch.distributed.run ARGS`), and so is everything it
does, with one difference. A worker that stops cleanly (asked to, via SIGUSR1/SIGTERM: it
finished its step and saved) exits with `rlvr.loop.PREEMPTED_EXIT`; one that stopped the run
for a failure after saving and saying why exits with `FAILED_EXIT`. torchrun reports any
non-zero exit as a crash: an `E... failed (exitcode: 3)` line, then a ~30-line traceback and
ChildFailedError banner in the trainer's log, and exit code 1. Here, when the first rank to end
exited with one of those two codes, neither is printed and this process exits with that code,
so a launcher still sees a non-zero exit (and now which one). Every other failure reads exactly
as torchrun's own.
"""

from __future__ import annotations

import logging
import sys
from typing import Protocol, cast

# rlvr.loop's exit codes (that module is layers above this one; tests/unit/launch pins them equal)
PREEMPTED_EXIT = 3
FAILED_EXIT = 4
QUIET_EXITS = frozenset({PREEMPTED_EXIT, FAILED_EXIT})

_AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"  # logs "failed (exitcode: N) local_rank: ..."


class _QuietStops(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("failed (exitcode") and isinstance(record.args, tuple) and record.args:
            return record.args[0] not in QUIET_EXITS
        return True


def quiet_exit(error: BaseException) -> int | None:
    """The exit code to leave with, without torchrun's report, when the first rank to fail
    stopped on its own terms; None for any other failure."""
    get_first = getattr(error, "get_first_failure", None)
    if get_first is None:
        return None
    _, failure = get_first()
    code = getattr(failure, "exitcode", None)
    return code if code in QUIET_EXITS else None


class _Run(Protocol):
    """`torch.distributed.run` as rlvr calls it (torch leaves its argument unannotated)."""

    def main(self, args: list[str] | None = None) -> None: ...


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    logging.getLogger(_AGENT_LOGGER).addFilter(_QuietStops())
    try:
        cast(_Run, run).main(sys.argv[1:] if argv is None else argv)
    except ChildFailedError as exc:
        code = quiet_exit(exc)
        if code is None:
            raise
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
