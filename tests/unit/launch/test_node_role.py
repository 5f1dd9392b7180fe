"""node.py's pure logic: which node am I, what does it run, on which GPUs and ports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlvr.launch.argv import trainer_command
from rlvr.launch.node import (
    ROLLOUT,
    TRAINER,
    NodeError,
    master_port_for,
    node_index,
    node_role,
)
from rlvr.launch.slurm import wait_and_watch
from rlvr.recipe.load import load_recipe
from rlvr.recipe.plan import make_plan
from tests.conftest import ROOT

HOSTS = ["gpu001", "gpu002", "gpu003", "gpu004"]


@pytest.fixture(scope="module")
def plan():
    return make_plan(load_recipe(ROOT / "recipes" / "math_code_judge.toml", ["cluster.nodes=4"]))


def env(name: str, node_id: int, **more: str) -> dict[str, str]:
    return {"SLURMD_NODENAME": name, "SLURM_NODEID": str(node_id), "SLURM_JOB_ID": "1234", **more}


def test_first_node_trains(plan):
    role = node_role(plan, env=env("gpu001", 0), hostnames=HOSTS)
    assert (role.kind, role.index, role.node_rank, role.servers) == (TRAINER, 0, 0, ())
    assert role.master_node == "gpu001" and role.is_first_trainer
    argv = trainer_command(plan, run_dir="/r", node_rank=role.node_rank, master_addr="10.0.0.1")
    assert "--nnodes=1" in argv and "--nproc-per-node=8" in argv and "--node-rank=0" in argv


def test_other_nodes_serve_eight_single_gpu_servers_each(plan):
    role = node_role(plan, env=env("gpu003", 2), hostnames=HOSTS)
    assert (role.kind, role.index, role.node_rank) == (ROLLOUT, 2, -1)
    assert [s.index for s in role.servers] == list(range(8, 16))
    assert [s.gpus for s in role.servers] == [[g] for g in range(8)]
    assert len({s.port for s in role.servers}) == 8  # one port per server on a node
    assert role.master_node == "gpu001"


def test_two_trainer_nodes_get_node_ranks():
    recipe = load_recipe(ROOT / "recipes" / "math_code_judge.toml", ["cluster.nodes=4", "cluster.trainer_nodes=2"])
    plan = make_plan(recipe)
    ranks = [node_role(plan, env=env(h, i), hostnames=HOSTS) for i, h in enumerate(HOSTS)]
    assert [(r.kind, r.node_rank) for r in ranks] == [(TRAINER, 0), (TRAINER, 1), (ROLLOUT, -1), (ROLLOUT, -1)]
    assert len(ranks[2].servers) == len(ranks[3].servers) == 8


def test_emulated_nodes_on_one_host_are_told_apart_by_slurmd_nodename():
    """The test cluster: one hostname, two slurmd; SLURMD_NODENAME wins over a wrong SLURM_NODEID."""
    assert node_index({"SLURMD_NODENAME": "node2", "SLURM_NODEID": "0"}, ["node1", "node2"]) == 1
    assert node_index({"SLURM_NODEID": "1"}, ["node1", "node2"]) == 1
    assert node_index({}, ["node1"]) == 0


def test_allocation_must_match_the_plan(plan):
    with pytest.raises(NodeError, match="plans 4 nodes but this job has 2"):
        node_role(plan, env=env("gpu001", 0), hostnames=HOSTS[:2])


def test_attempt_changes_with_restart_count(plan):
    first = node_role(plan, env=env("gpu001", 0), hostnames=HOSTS)
    again = node_role(plan, env=env("gpu001", 0, SLURM_RESTART_COUNT="1"), hostnames=HOSTS)
    assert (first.attempt, again.attempt) == ("1234.0", "1234.1")


def test_master_port(plan):
    assert master_port_for(plan, {"RLVR_MASTER_PORT": "40000", "SLURM_JOB_ID": "7"}) == 40000
    assert master_port_for(plan, {}) == plan.master_port
    ports = {master_port_for(plan, {"SLURM_JOB_ID": str(j)}) for j in range(1000, 3000)}
    assert min(ports) >= plan.master_port and max(ports) < 30000  # below the rollout servers' ports


@pytest.mark.parametrize("terminal", [True, False], ids=["dashboard", "plain-lines"])
def test_wait_and_watch_follows_slurm_across_a_requeue(tmp_path: Path, terminal: bool):
    """The dashboard ends when status says stopped, but the job is requeued: keep following SLURM.
    Off a terminal (a log file) the same run reads as plain lines."""
    from io import StringIO

    from rich.console import Console

    status = tmp_path / "status.json"
    states = iter(
        [("PENDING", "Priority"), ("RUNNING", ""), ("RUNNING", ""), ("PENDING", "BeginTime"), ("RUNNING", "")]
        + [("RUNNING", "")] * 3
    )

    def fake_state(job_id: str) -> tuple[str, str]:
        state = next(states, ("COMPLETED", ""))
        if state == ("RUNNING", "") and not status.exists():
            status.write_text(json.dumps({"state": "stopped", "step": 3, "max_steps": 6, "started_at": 1.0}))
        elif state[0] == "PENDING" and status.exists():
            status.write_text(json.dumps({"state": "finished", "step": 6, "max_steps": 6, "started_at": 2.0}))
        return state

    out = StringIO()
    console = Console(file=out, width=100, force_terminal=terminal)
    final = wait_and_watch("42", tmp_path, console=console, poll_s=0.01, state_fn=fake_state)
    assert final == "COMPLETED"
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue()) if terminal else out.getvalue()
    assert "job 42: PENDING (Priority)" in text and "job 42: PENDING (BeginTime)" in text
    assert text.rstrip().endswith("job 42: COMPLETED")
    if terminal:
        assert "[stopped]" in text and "[finished]" in text
    else:
        assert "run stopped at step 3/6" in text and "run finished at step 6/6" in text
        assert "\x1b[" not in text  # no control codes in a log file
