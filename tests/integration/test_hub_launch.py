"""`rlvr launch` with hub ids: the policy and the judge are `org/name` ids in a hub cache (built
under tmp in huggingface_hub's layout, offline: nothing is downloaded), and every process (the
rollout server, the judge server, the trainer rank) loads the one snapshot folder that the
launcher resolved and wrote into the run's resolved recipe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


def add_snapshot(cache: Path, repo: str, commit: str, files: Path) -> Path:
    storage = cache / ("models--" + repo.replace("/", "--"))
    shutil.copytree(files, storage / "snapshots" / commit)
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(commit)
    return storage / "snapshots" / commit


def test_a_launch_from_hub_ids_runs_every_process_on_the_snapshot(tmp_path: Path) -> None:
    cache = tmp_path / "hf" / "hub"
    policy = add_snapshot(cache, "rlvr-test/tiny-policy", "a" * 40, ROOT / "recipes" / "quickstart" / "policy")
    judge = add_snapshot(cache, "rlvr-test/tiny-judge", "b" * 40, ROOT / "recipes" / "quickstart" / "judge")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    sets = [
        f"experiment.output_dir={json.dumps(str(tmp_path / 'runs'))}",
        "model.path=rlvr-test/tiny-policy",
        "judge.model=rlvr-test/tiny-judge",
        "experiment.max_steps=1",
        "experiment.eval_steps=0",
        "experiment.save_steps=0",
        "data.prompts_per_step=4",  # one short step: this checks where the weights come from, not learning
    ]
    command = [sys.executable, "-m", "rlvr.cli", "launch", str(QUICKSTART), "--no-dashboard"]
    result = subprocess.run(
        command + [x for s in sets for x in ("--set", s)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        f"model.path: rlvr-test/tiny-policy @ main -> {policy} (cached)",
        f"judge.model: rlvr-test/tiny-judge @ main -> {judge} (cached)",
    ]
    run = tmp_path / "runs" / "quickstart"
    resolved = json.loads((run / "resolved_recipe.json").read_text())
    assert (resolved["model"]["path"], resolved["judge"]["model"]) == (str(policy), str(judge))
    logs = run / "logs"
    assert f"rlvr serve: loading {policy};" in (logs / "rollout-0.log").read_text()
    assert f"rlvr serve: loading {judge};" in (logs / "judge.log").read_text()
    assert f"-m rlvr.worker --run-dir {run} " in (logs / "trainer.log").read_text()  # it reads that resolved recipe
    assert lines[-1] == f"finished at 1/1; results in {run}"
