"""A stand-in for torchrun's agent in launcher tests:
`python fake_agent.py OUT RESUME [--die-with-parent] [--heartbeat PATH]`.

Like torchrun it starts its worker in a session of its own and exits with the worker's code (1,
saying `(exitcode: -N)`, for a worker killed by signal N). The
worker sleeps; with `--die-with-parent` it first asks for the parent-death signal as `rlvr.worker`
does (`stay_with_parent`), else it has none, so only the launcher can end it once its agent is
gone; with `--heartbeat` it beats into PATH every 0.1 s as a trainer rank does (`Heartbeat`).
When the worker is up, the agent writes OUT/<n>.json (n = 1, 2, ...: one per start) with both
pids, the argv's resume and the generation and restart count the launcher passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

WORKER = """
import sys, time
from pathlib import Path
from rlvr.process import Heartbeat, stay_with_parent
if sys.argv[2] == "1" and not stay_with_parent():
    sys.exit(1)
if sys.argv[3]:
    Heartbeat(Path(sys.argv[3]), interval_s=0.1).start()
Path(sys.argv[1]).write_text("up")
time.sleep(600)
"""


def main() -> int:
    out, resume = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    ready = out / f".ready-{os.getpid()}"
    die = "1" if "--die-with-parent" in sys.argv else "0"
    heartbeat = sys.argv[sys.argv.index("--heartbeat") + 1] if "--heartbeat" in sys.argv else ""
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(ready), die, heartbeat], start_new_session=True)
    while not ready.exists() and worker.poll() is None:
        time.sleep(0.02)
    record = {
        "agent": os.getpid(),
        "worker": worker.pid,
        "resume": resume,
        "generation": os.environ.get("RLVR_TRAINER_GENERATION"),
        "restart": os.environ.get("RLVR_TRAINER_RESTART"),
    }
    n = len(list(out.glob("*.json"))) + 1
    (out / f".{n}.tmp").write_text(json.dumps(record))
    os.replace(out / f".{n}.tmp", out / f"{n}.json")
    code = worker.wait()
    if code < 0:  # as torchrun reports a worker killed by a signal (ChildFailedError), and exits 1
        print(f"[0]:\n  exitcode  : {code} (pid: {worker.pid})\n(exitcode: {code})", file=sys.stderr, flush=True)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
