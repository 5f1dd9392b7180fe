"""Test-only child for the local launcher's GPU split: records what it was given, nothing more.

As a rollout server (`--host H --port P`, via RLVR_SERVER_MODULE) it writes
`$ONEBOX_RECORD/server-<port>.json` with its CUDA_VISIBLE_DEVICES and the plan's GPU count,
then answers /health. As the trainer (`--run-dir RUN`, via RLVR_WORKER_MODULE under torchrun)
each rank writes `$ONEBOX_RECORD/rank-<RANK>.json` and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def record(name: str) -> None:
    keys = ("CUDA_VISIBLE_DEVICES", "RLVR_PLAN_GPUS", "LOCAL_RANK")
    data = {key: os.environ.get(key) for key in keys} | {"argv": sys.argv[1:]}
    Path(os.environ["ONEBOX_RECORD"], f"{name}.json").write_text(json.dumps(data))


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(200 if self.path.startswith("/health") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--run-dir")
    parser.add_argument("--resume")
    args = parser.parse_args()
    if args.run_dir:
        record(f"rank-{os.environ.get('RANK', '0')}")
        return 0
    record(f"server-{args.port}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with ThreadingHTTPServer((args.host, args.port), Health) as server:
        server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
