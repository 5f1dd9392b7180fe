"""The local launcher's supervision: a dead child stops the run with its root cause in one line and
the run marked failed; Ctrl-C saves and tears every process down; off a terminal, plain lines."""

from __future__ import annotations

import json
import os
import re
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


def test_a_server_that_dies_stops_the_run_with_its_root_cause(tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"  # passes validate (tokenizer, a weights file) but no server can load it
    broken.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (broken / name).write_bytes((QUICKSTART.parent / "quickstart" / "policy" / name).read_bytes())
    (broken / "model.safetensors").write_bytes(b"")
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
    assert 'File "' not in result.stderr  # the cause, not a traceback
    errors = [line for line in result.stderr.strip().splitlines() if not line.startswith("note: ")]
    assert len(errors) == 1, result.stderr  # (a note: "nonsense" is outside the family matrix)
    assert "KeyError: 'nonsense'" in result.stderr  # the server's own error (transformers knows no such model_type)
    status = json.loads((tmp_path / "quickstart" / "status.json").read_text())
    assert status["state"] == "failed" and "rollout-0" in status["error"]
    assert not processes_mentioning(str(tmp_path))


def test_a_trainer_that_fails_shows_the_cause_not_torchruns_banner(tmp_path: Path) -> None:
    broken = tmp_path / "step_3"  # looks like a checkpoint (meta.json) but holds no weights
    broken.mkdir()
    (broken / "meta.json").write_text("{}")
    result = subprocess.run(
        [*command(tmp_path), "--resume", str(broken)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert line.startswith("error: trainer exited with code 1: ") and "logs/trainer.log" in line
    assert "ChildFailedError" not in line and "Error" in line
    run_dir = tmp_path / "quickstart"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed"
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1]["level"] == "error" and "trainer exited" in events[-1]["message"]
    assert result.stdout.strip().endswith("rerun the same command to resume from the last checkpoint")


def test_a_reward_that_cannot_judge_stops_the_run_with_a_checkpoint_and_one_line(tmp_path: Path) -> None:
    """A plug-in whose backend is down raises on every call: the run does not train on those zeros
    (nor goes on to the end with exit 0, as it did); it saves, stops, and says why in one line."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "down_reward.py").write_text(
        "def score(sample, completion):\n    raise RuntimeError('reward backend unavailable')\n"
    )
    result = subprocess.run(
        command(tmp_path, "experiment.max_steps=3", 'domains.math.reward="down_reward:score"'),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(plugins)},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert re.fullmatch(
        r"error: reward math could not judge (\d+) of \1 samples in step 1: RuntimeError: reward backend "
        r"unavailable \(checkpoint step_0 saved; rerun the same command to resume\)",
        line,
    ), line
    run_dir = tmp_path / "quickstart"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["error"] == line.removeprefix("error: ")
    assert (run_dir / "checkpoints" / "step_0" / "meta.json").exists()
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip()
    events = [json.loads(x)["message"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(m.startswith("reward math could not judge") and "(not trained on)" in m for m in events)
    samples = (
        [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
        if (run_dir / "samples.jsonl").exists()
        else []
    )
    assert all(r["verdict"] == "failed" for r in samples if r["domain"] == "math")
    assert not processes_mentioning(str(tmp_path))


def test_a_judge_that_does_not_answer_stops_the_launch_before_step_1(tmp_path: Path) -> None:
    result = subprocess.run(
        command(tmp_path, 'domains.words.reward_args.judge_url="http://127.0.0.1:9"'),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert line.startswith(
        "error: judge http://127.0.0.1:9 (domains.words) does not answer before step 1: ClientConnectorError"
    ), line
    assert len(line.splitlines()) == 1
    assert not (tmp_path / "quickstart" / "metrics.jsonl").read_text().strip()  # no step ran


def kill_server_after(run_dir: Path, proc: subprocess.Popen, *, step: int, server: int = 0) -> int:
    """SIGKILL rollout server `server` (found by its registered port) once `step` is logged; its old pid."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not metrics.exists() or len(metrics.read_text().splitlines()) < step:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    port = json.loads((run_dir / "servers" / f"{server}.json").read_text())["url"].rsplit(":", 1)[1]
    found = subprocess.run(["pgrep", "-f", f"rlvr.cli serve .*--port {port}"], capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    assert len(pids) == 1, found.stdout
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


def test_a_killed_server_in_fail_mode_stops_with_a_checkpoint_and_its_name(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        command(tmp_path, "experiment.max_steps=30", "experiment.save_steps=0", "experiment.eval_steps=0"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run_dir = tmp_path / "quickstart"
    kill_server_after(run_dir, proc, step=2)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"error: rollout-0 died with code -9: killed by SIGKILL \(log: \S+/logs/rollout-0\.log\) "
        r"\(checkpoint step_\d+ saved; rerun the same command to resume\)",
        line,
    ), line
    saved = int(line.rsplit("step_", 1)[1].split()[0])
    assert saved >= 2  # the steps trained before the death are kept
    assert (run_dir / "checkpoints" / f"step_{saved}" / "meta.json").exists()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "failed"
    assert not processes_mentioning(str(tmp_path))


def test_a_killed_server_in_continue_mode_is_restarted_and_rejoins_after_a_full_push(tmp_path: Path) -> None:
    """Two servers; rollout-1 is killed at step 2. Generation goes on with rollout-0, the launcher
    restarts rollout-1 on its port, and the weight sync holds it until a push has given it every
    weight: two steps after its restart, a push reaches both servers and both serve exactly the
    pushed weights (`sync/verified_engines` 2: their fingerprints match). Whether a push first saw
    it down (`sync/engines` 1) depends on the machine's speed: a slow step outlasts the restart. The
    run is long and is stopped with Ctrl-C once that is seen; every step is logged once."""
    proc = subprocess.Popen(
        command(tmp_path, "experiment.max_steps=400", "experiment.save_steps=0", "experiment.eval_steps=0",
                "rollout.servers=2", "sync.on_engine_failure=continue"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run_dir = tmp_path / "quickstart"
    old = kill_server_after(run_dir, proc, step=2, server=1)

    def rows() -> list[dict]:
        return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]

    def restarted() -> bool:
        return "rollout-1 restarted (pid" in (run_dir / "events.jsonl").read_text()

    deadline, since = time.monotonic() + 400, None
    while (
        since is None
        or not any(  # back: a push two steps after the restart reached and verified both
            r["sync/engines"] == 2 and r.get("sync/verified_engines") == 2 for r in rows()[since + 1 :]
        )
    ):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, [(r["sync/engines"], r.get("sync/verified_engines")) for r in rows()]
        if since is None and restarted():
            since = len(rows())
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-3000:]
    assert (
        f"rollout-1 died with code -9: killed by SIGKILL (log: {run_dir}/logs/rollout-1.log); restarting it in 2 s "
        "(attempt 1 of 3); it serves again after the next full weight push"
    ) in stderr
    assert "rollout-1 restarted (pid " in stderr and f"(pid {old})" not in stderr and "attempt 2" not in stderr
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert not processes_mentioning(str(tmp_path))


def test_ctrl_c_checkpoints_and_tears_everything_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "quickstart"
    log = (tmp_path / "launch.log").open("w")  # not a terminal: plain lines, one per step
    proc = subprocess.Popen(
        command(tmp_path, "experiment.max_steps=1000", "experiment.save_steps=0", "experiment.eval_steps=0"),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.2)
    servers = {p.name: p.read_text() for p in (run_dir / "servers").iterdir()}
    second = subprocess.run(
        command(tmp_path, "experiment.max_steps=1000"), capture_output=True, text=True, timeout=120, cwd=ROOT
    )  # two launches into one run directory: the second is refused before it writes anything
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"run active (pid {proc.pid} on " in second.stderr
    assert {p.name: p.read_text() for p in (run_dir / "servers").iterdir()} == servers
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "stopped"
    printed = (tmp_path / "launch.log").read_text().splitlines()
    assert printed[0] == f"run directory: {run_dir}"
    assert printed[1].startswith("step 1/1000  reward ") and "s/step" in printed[1]
    assert printed[-1] == f"stopped at step {status['step']}/1000: rerun the same command to resume"
    assert "\x1b[" not in "".join(printed)
    assert (run_dir / "checkpoints" / f"step_{status['step']}" / "meta.json").exists()  # saved on the way out
    port = json.loads(next((run_dir / "servers").glob("*.json")).read_text())["url"].rsplit(":", 1)[1]
    judge_port = (run_dir / "servers" / "judge.url").read_text().rsplit(":", 1)[1]
    ours = [str(run_dir), f"--port {port}", f"--port {judge_port}"]
    for _ in range(50):
        if not any(processes_mentioning(text) for text in ours):
            break
        time.sleep(0.2)
    assert not [p for text in ours for p in processes_mentioning(text)]
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert "Traceback" not in trainer_log and "ChildFailedError" not in trainer_log, trainer_log[-3000:]
    assert "failed (exitcode" not in trainer_log  # a clean stop is not reported as a crash


def test_a_resumed_launch_says_so_prints_only_its_steps_and_lists_recipe_changes(tmp_path: Path) -> None:
    run_dir = tmp_path / "quickstart"
    first = subprocess.run(
        command(tmp_path, "experiment.max_steps=1", "experiment.save_steps=1", "experiment.eval_steps=0"),
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    again = subprocess.run(
        command(tmp_path, "experiment.max_steps=2", "experiment.save_steps=1", "experiment.eval_steps=0"),
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    lines = again.stdout.splitlines()
    assert lines[:3] == [
        f"run directory: {run_dir}",
        "recipe changed since the last launch: experiment.max_steps 1 -> 2",
        f"resumed from step_1 ({run_dir}/checkpoints/step_1)",
    ], again.stdout
    assert [line.split("  ")[0] for line in lines[3:-1]] == ["step 2/2"], again.stdout  # step 1 not replayed
    assert lines[-1] == f"finished at 2/2; results in {run_dir}"
    assert [p.name for p in sorted((run_dir / "recipes").iterdir())] == ["launch-1.json", "launch-2.json"]
    assert json.loads((run_dir / "recipes" / "launch-1.json").read_text())["experiment"]["max_steps"] == 1
    assert (run_dir / "recipes" / "launch-2.json").read_text() == (run_dir / "resolved_recipe.json").read_text()
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert "Traceback" not in trainer_log and "Loading weights" not in trainer_log, trainer_log[-2000:]


def test_torchrun_wrapper_is_quiet_about_a_clean_stop_and_keeps_the_code(tmp_path: Path) -> None:
    """`rlvr.trainer.torchrun` (the trainer command): a worker that exits with the loop's stop or
    failure code leaves no torchrun traceback and the same code; any other failure reads as torchrun's."""
    from rlvr.loop import FAILED_EXIT, PREEMPTED_EXIT
    from rlvr.process import free_port
    from rlvr.trainer.torchrun import QUIET_EXITS

    assert {PREEMPTED_EXIT, FAILED_EXIT} == QUIET_EXITS
    worker = tmp_path / "worker.py"
    worker.write_text("import sys\nprint('worker ran', flush=True)\nsys.exit(int(sys.argv[1]))\n")
    for code, quiet in ((PREEMPTED_EXIT, True), (FAILED_EXIT, True), (1, False)):
        result = subprocess.run(
            [sys.executable, "-m", "rlvr.trainer.torchrun", "--nproc-per-node=1", f"--master-port={free_port()}",
             str(worker), str(code)],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        out = result.stdout + result.stderr
        assert "worker ran" in out
        if quiet:
            assert result.returncode == code and "Traceback" not in out and "failed (exitcode" not in out, out
        else:
            assert result.returncode == 1 and "ChildFailedError" in out and "exitcode  : 1" in out, out
