"""`rlvr validate` refuses every sync method SGLang 0.5.23 cannot serve: one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from tests.unit.recipe.helpers import MINIMAL, write_recipe

runner = CliRunner()
SGLANG = MINIMAL.replace("[rollout]\n", '[rollout]\nengine = "sglang"\n')

CASES = {
    "dp with auto": ("sglang.dp_size = 2\n", "sync.method: 'auto' with rollout.sglang.dp_size = 2"),
    "dp with broadcast": (
        'sglang.dp_size = 4\n\n[sync]\nmethod = "broadcast"\n',
        "sync.method: 'broadcast' with rollout.sglang.dp_size = 4",
    ),
    "inprocess": ('\n[sync]\nmethod = "inprocess"\n', "sync.method: inprocess needs the embedded engine"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_unsupported_sglang_sync_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    extra, expected = CASES[case]
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path, SGLANG + extra))])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert expected in message, message
    assert case == "inprocess" or 'set sync.method = "disk"' in message, message
    assert len(result.stderr.strip().splitlines()) == 1


def test_dp_servers_with_disk_sync_validate(tmp_path: Path, monkeypatch) -> None:
    # a local sglang engine needs GPUs (validate checks the machine): one trainer rank + dp 2 = 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    body = SGLANG + 'sglang.dp_size = 2\n\n[sync]\nmethod = "disk"\n'
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path, body))])
    assert result.exit_code == 0, result.output
