"""The local launcher's supervision: a dead child stops the run with its log tail; Ctrl-C saves and
tears every process down."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


def command(out: Path, *overrides: str) -> list[str]:
    sets = [f"experiment.output_dir={json.dumps(str(out))}", *overrides]
    return [
        sys.executable,
        "-m",
        "rlvr.cli",
        "launch",
        str(QUICKSTART),
        "--no-dashboard",
        *(x for s in sets for x in ("--set", s)),
    ]


def processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "stat,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and not line.startswith("Z") and "ps -ww" not in line]


def test_a_server_that_dies_stops_the_run_with_its_log_tail(tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "nonsense"}')
    result = subprocess.run(
        command(tmp_path, f"model.path={json.dumps(str(broken))}"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "rollout-0 exited with code" in result.stderr
    assert "logs/rollout-0.log" in result.stderr
    assert 'File "' in result.stderr  # the server's own log tail (its traceback)
    assert not processes_mentioning(str(tmp_path))


def test_ctrl_c_checkpoints_and_tears_everything_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "quickstart"
    proc = subprocess.Popen(
        command(tmp_path, "experiment.max_steps=1000", "experiment.save_steps=0", "experiment.eval_steps=0"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "stopped"
    assert (run_dir / "checkpoints" / f"step_{status['step']}" / "meta.json").exists()  # saved on the way out
    port = json.loads(next((run_dir / "servers").glob("*.json")).read_text())["url"].rsplit(":", 1)[1]
    judge_port = (run_dir / "servers" / "judge.url").read_text().rsplit(":", 1)[1]
    ours = [str(run_dir), f"--port {port}", f"--port {judge_port}"]
    for _ in range(50):
        if not any(processes_mentioning(text) for text in ours):
            break
        time.sleep(0.2)
    assert not [p for text in ours for p in processes_mentioning(text)]
