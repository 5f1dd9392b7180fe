"""The RL loop on the real vLLM: `rlvr launch recipes/quickstart.toml --set rollout.engine=vllm`.

Each test launches the quickstart as a user does (vLLM server, judge, torchrun trainer), so each
pays vLLM's start-up (about a minute on the 2-core CPU machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_quickstart import ROOT, launch, launch_command, metrics

pytestmark = pytest.mark.vllm


def vllm_sets(python: Path, *more: str) -> list[str]:
    return ["rollout.engine=vllm", f"rollout.vllm.python={python}", *more]


def test_quickstart_on_vllm_learns(tmp_path: Path, vllm_python: Path) -> None:
    steps = 30
    result = launch(
        tmp_path, *vllm_sets(vllm_python), f"experiment.max_steps={steps}", "experiment.eval_steps=0",
        "experiment.save_steps=0",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "quickstart"
    by_step = metrics(run_dir)
    assert sorted(by_step) == list(range(1, steps + 1))
    first = sum(by_step[s]["reward/mean"] for s in range(1, 6)) / 5
    last = sum(by_step[s]["reward/mean"] for s in range(steps - 4, steps + 1)) / 5
    assert last > first + 0.1, (first, last)
    assert all(by_step[s]["rollout/staleness_max"] == 0 for s in by_step)  # k = 0: every token from the newest weights
    assert (run_dir / "logs" / "rollout-0.log").read_text().count("vllm") > 0  # the server really was vLLM


def test_asynchronous_run_keeps_the_staleness_bound_with_vllms_tags(tmp_path: Path, vllm_python: Path) -> None:
    """k = 1: every version the trainer bounds comes from vLLM's own tags (read as 0, every sample
    would look `step` versions old and be dropped as stale); the bound holds and generation overlaps.
    A sample that spans a push is tested in test_engine (keep mode): here the quickstart's short
    answers are mostly done before the push lands."""
    steps = 8
    result = launch(
        tmp_path, *vllm_sets(vllm_python, "rollout.max_staleness=1", "algorithm.tis_cap=2.0"),
        f"experiment.max_steps={steps}", "experiment.eval_steps=0", "experiment.save_steps=0",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    by_step = metrics(tmp_path / "quickstart")
    assert sorted(by_step) == list(range(1, steps + 1))
    assert max(by_step[s]["rollout/staleness_max"] for s in by_step) <= 1
    assert any(by_step[s]["rollout/staleness_max"] == 1 for s in by_step)  # it did overlap


def _start(out: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        launch_command(out, *overrides), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def _kill_server_after(run_dir: Path, proc: subprocess.Popen, *, step: int, server: int = 0) -> None:
    """SIGKILL rollout server `server`'s process group once `step` is in metrics.jsonl."""
    deadline = time.monotonic() + 600
    while not (run_dir / "metrics.jsonl").exists() or len((run_dir / "metrics.jsonl").read_text().splitlines()) < step:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.3)
    url = json.loads((run_dir / "servers" / f"{server}.json").read_text())["url"]
    port = url.rsplit(":", 1)[1]
    found = subprocess.run(["pgrep", "-f", f"vllm.entrypoints.openai.api_server.*--port {port}"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    pids = [int(p) for p in found.stdout.split()]
    assert pids, f"no vLLM server on port {port}"
    for pid in pids:
        os.killpg(os.getpgid(pid), signal.SIGKILL)


def test_a_killed_vllm_server_stops_the_run_with_one_line(tmp_path: Path, vllm_python: Path) -> None:
    """on_engine_failure = fail (the default): the run stops, saying which server died and where its log is."""
    proc = _start(tmp_path, *vllm_sets(vllm_python), "experiment.max_steps=40", "experiment.save_steps=0",
                  "experiment.eval_steps=0")  # fmt: skip
    _kill_server_after(tmp_path / "quickstart", proc, step=2)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: rollout-0 died with code -9") and "rollout-0.log" in last, last


def test_continue_mode_goes_on_without_a_killed_server(tmp_path: Path, vllm_python: Path) -> None:
    """on_engine_failure = continue with two servers: one is killed mid-run; the launcher restarts it
    and the run finishes (on the other while the restarted one loads, then on both)."""
    steps = 8
    proc = _start(
        tmp_path, *vllm_sets(vllm_python), "rollout.servers=2", "sync.on_engine_failure=continue",
        f"experiment.max_steps={steps}", "experiment.save_steps=0", "experiment.eval_steps=0",
    )  # fmt: skip
    run_dir = tmp_path / "quickstart"
    _kill_server_after(run_dir, proc, step=3, server=1)
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    assert "rollout-1 died with code -9: killed by SIGKILL" in stderr
    assert "restarting it in 2 s (attempt 1 of 3)" in stderr
    by_step = metrics(run_dir)
    assert sorted(by_step) == list(range(1, steps + 1))
    assert by_step[steps]["sync/engines"] >= 1.0
    events = (run_dir / "events.jsonl").read_text()
    assert "rollout-1 died" in events


def test_a_model_vllm_cannot_load_is_one_line_before_training(tmp_path: Path, vllm_python: Path) -> None:
    """transformers loads it (by model_type), vLLM does not (by architecture): the launch stops
    before any step with vLLM's reason, naming the server and its log."""
    import shutil

    model = tmp_path / "policy"
    shutil.copytree(ROOT / "recipes" / "quickstart" / "policy", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"architectures": ["NoSuchModelForCausalLM"]}))
    result = launch(tmp_path, *vllm_sets(vllm_python), f"model.path={model}", timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rollout-0 exited with code") and "before it was healthy" in last, last
    assert "NoSuchModelForCausalLM" in last and "rollout-0.log" in last, last
    assert not (tmp_path / "quickstart" / "metrics.jsonl").exists()
