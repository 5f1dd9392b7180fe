"""`rlvr serve` that SIGKILLs itself at a chosen moment, once: in the middle of a weight push (a
kill no outside timer can land: a push of the quickstart's 3 MB takes milliseconds) or while it
generates. The launcher starts it in place of each rollout server (`RLVR_SERVER_MODULE`, argv
`--host H --port P`); it serves `RLVR_DYING_MODEL` and dies on the first bucket of push number
`RLVR_DYING_AT_PUSH`, or on its `RLVR_DYING_AT_GENERATE`-th /generate request, unless
`RLVR_DYING_MARK` exists, which it creates first: its restarted self serves on."""

from __future__ import annotations

import os
import signal
import sys

from rlvr.server.embedded import EmbeddedEngine
from rlvr.server.receiver import WeightReceiver

_pushes = _generates = 0
_begin, _receive = WeightReceiver.begin_session, WeightReceiver.receive_bucket
_generate = EmbeddedEngine.generate_detailed


def _die_once() -> None:
    mark = os.environ["RLVR_DYING_MARK"]
    if not os.path.exists(mark):
        open(mark, "w").close()  # noqa: SIM115 - a marker, written before the kill
        os.kill(os.getpid(), signal.SIGKILL)


def _counting_begin(self: WeightReceiver) -> None:
    global _pushes
    _pushes += 1
    _begin(self)


def _dying_receive(self: WeightReceiver, *args: object, **kwargs: object) -> object:
    if _pushes == int(os.environ.get("RLVR_DYING_AT_PUSH", "0")):
        _die_once()
    return _receive(self, *args, **kwargs)  # type: ignore[arg-type]


async def _dying_generate(self: EmbeddedEngine, *args: object, **kwargs: object) -> object:
    global _generates
    _generates += 1
    if _generates == int(os.environ.get("RLVR_DYING_AT_GENERATE", "0")):
        _die_once()
    return await _generate(self, *args, **kwargs)  # type: ignore[arg-type]


WeightReceiver.begin_session = _counting_begin  # type: ignore[method-assign]
WeightReceiver.receive_bucket = _dying_receive  # type: ignore[method-assign]
EmbeddedEngine.generate_detailed = _dying_generate  # type: ignore[method-assign]

if __name__ == "__main__":
    from rlvr.cli import app

    sys.argv = ["rlvr", "serve", os.environ["RLVR_DYING_MODEL"], *sys.argv[1:], "--max-seq-len", "128"]
    app()
