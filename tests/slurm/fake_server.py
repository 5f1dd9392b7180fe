"""Test-only stand-in for a rollout server: answers /health and /get_model_info.

Launcher tests set `RLVR_SERVER_MODULE=tests.slurm.fake_server`, and every launcher then
starts `python -m tests.slurm.fake_server --host H --port P` instead of the real server, so
they need no model engine.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.startswith("/health"):
            body = b""
        elif self.path == "/get_model_info":
            body = json.dumps({"model_path": "fake", "is_generation": True}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.slurm.fake_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with ThreadingHTTPServer((args.host, args.port), Handler) as server:
        print(f"fake rollout server on http://{args.host}:{args.port}", flush=True)
        server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
