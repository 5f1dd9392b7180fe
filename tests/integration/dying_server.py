"""`rlvr serve` that SIGKILLs itself in the middle of a weight push, once: a kill no outside timer
can land (a push of the quickstart's 3 MB takes milliseconds). The launcher starts it in place of
each rollout server (`RLVR_SERVER_MODULE`, argv `--host H --port P`); it serves
`RLVR_DYING_MODEL` and dies on the first bucket of push number `RLVR_DYING_AT_PUSH` unless
`RLVR_DYING_MARK` exists, which it creates first: its restarted self serves on."""

from __future__ import annotations

import os
import signal
import sys

from rlvr.server.receiver import WeightReceiver

_pushes = 0
_begin, _receive = WeightReceiver.begin_session, WeightReceiver.receive_bucket


def _counting_begin(self: WeightReceiver) -> None:
    global _pushes
    _pushes += 1
    _begin(self)


def _dying_receive(self: WeightReceiver, *args: object, **kwargs: object) -> object:
    mark = os.environ["RLVR_DYING_MARK"]
    if _pushes == int(os.environ.get("RLVR_DYING_AT_PUSH", "3")) and not os.path.exists(mark):
        open(mark, "w").close()  # noqa: SIM115 - a marker, written before the kill
        os.kill(os.getpid(), signal.SIGKILL)
    return _receive(self, *args, **kwargs)  # type: ignore[arg-type]


WeightReceiver.begin_session = _counting_begin  # type: ignore[method-assign]
WeightReceiver.receive_bucket = _dying_receive  # type: ignore[method-assign]

if __name__ == "__main__":
    from rlvr.cli import app

    sys.argv = ["rlvr", "serve", os.environ["RLVR_DYING_MODEL"], *sys.argv[1:], "--max-seq-len", "128"]
    app()
