"""monitor.log_samples: whole episodes per domain and step in samples.jsonl, picked round-robin."""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.monitor.metrics import RunRecorder
from rlvr.monitor.samples import sample_rows
from rlvr.rundir import SAMPLES_FILE
from rlvr.types import Completion, Group, RewardResult, Sample


def group(domain: str, sid: str, texts: list[str], *, tools: bool = False) -> Group:
    stats = {"turns": 2.0, "tool_calls": 1.0, "tool_errors": 0.0, "tool_timeouts": 0.0, "tool_seconds": 0.1}
    return Group(
        sample=Sample(id=sid, tag=domain, domain=domain, messages=[{"role": "user", "content": sid}]),
        completions=[
            Completion(text=t, token_ids=[1] * len(t), logprobs=[0.0] * len(t), tool_stats=stats if tools else {})
            for t in texts
        ],
        rewards=[RewardResult(float(i)) for i in range(len(texts))],
    )


def test_rows_take_each_group_first_then_the_next_sample() -> None:
    groups = [group("math", "a", ["a0", "a1"]), group("math", "b", ["b0", "b1"]), group("qa", "c", ["c0", "c1"])]
    rows = sample_rows(groups, per_domain=3, step=7, prompt_text=lambda s: f"user: {s.id}")
    assert [(r["domain"], r["completion"], r["reward"]) for r in rows] == [
        ("math", "a0", 0.0),
        ("math", "b0", 0.0),
        ("math", "a1", 1.0),
        ("qa", "c0", 0.0),
        ("qa", "c1", 1.0),
    ]
    assert rows[0] == {
        "step": 7, "domain": "math", "id": "a", "prompt": "user: a", "completion": "a0", "reward": 0.0,
        "verdict": "scored", "reason": "", "finish_reason": "stop", "tokens": 2,
    }  # fmt: skip
    assert sample_rows(groups, per_domain=0, step=7, prompt_text=str) == []


def test_rows_carry_the_verdict_its_reason_and_the_ground_truth() -> None:
    g = group("math", "a", ["a0", "a1"])
    g.sample.ground_truth = "42"
    g.rewards = [
        RewardResult(0.0, {"reason": "not equivalent"}),
        RewardResult(0.0, {"reason": "RuntimeError: backend down"}, failed="RuntimeError: backend down"),
    ]
    rows = sample_rows([g], per_domain=2, step=1, prompt_text=str)
    assert [(r["verdict"], r["reward"], r["reason"], r["ground_truth"]) for r in rows] == [
        ("scored", 0.0, "not equivalent", "42"),
        ("failed", None, "RuntimeError: backend down", "42"),
    ]


def test_tool_episodes_carry_their_turns_and_calls() -> None:
    (row,) = sample_rows([group("t", "x", ["<code>1</code>"], tools=True)], per_domain=1, step=1, prompt_text=str)
    assert (row["turns"], row["tool_calls"], row["tool_errors"], row["tool_timeouts"]) == (2, 1, 0, 0)
    assert "own_text" not in row  # an episode that kept no own text (a single-turn one) writes none
    episode = group("t", "x", ["<code>1</code>\n<result>1</result>"], tools=True)
    episode.completions[0].own_text = "<code>1</code>"
    (row,) = sample_rows([episode], per_domain=1, step=1, prompt_text=str)
    assert row["own_text"] == "<code>1</code>"  # what the reward read


def test_recorder_appends_samples_and_writes_no_file_without_any(tmp_path: Path) -> None:
    recorder = RunRecorder(tmp_path, max_steps=2)
    recorder.samples([])
    assert not (tmp_path / SAMPLES_FILE).exists()
    recorder.samples([{"step": 1, "completion": "x"}])
    recorder.samples([{"step": 2, "completion": "y"}])
    recorder.close()
    lines = (tmp_path / SAMPLES_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
