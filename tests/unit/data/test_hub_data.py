"""`hf:org/name` data files (rlvr/recipe/hub_data.py): a data set in a hub cache built under tmp in
huggingface_hub's own layout (`datasets--org--name/refs/main`, `snapshots/<commit>/...`; no network),
read while the recipe loads with the domain's `hf` table (config, split, eval_split, revision,
column map), and `rlvr validate`'s one-line errors (asserted verbatim)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.data.sources import load_recipe_domains
from rlvr.recipe.load import load_recipe, resolved_json
from tests.unit.recipe.helpers import one_error_line

runner = CliRunner()
COMMIT = "c" * 40

RECIPE = """
[experiment]
name = "t"

[model]
config = { hidden_size = 32 }
dtype = "float32"

[domains.sums]
tags = ["sums"]
files = ["hf:rlvr-test/sums"]
eval_files = ["hf:rlvr-test/sums"]
reward = "math_rule"

[domains.sums.hf]
config = "main"
columns = { prompt = "question", ground_truth = "answer" }

[rollout]
n = 2
temperature = 0.7
"""


def table(n: int, start: int = 0) -> pa.Table:
    numbers = range(start, start + n)
    return pa.table({"question": [f"What is {i} + {i}?" for i in numbers], "answer": [str(2 * i) for i in numbers]})


def add_dataset(
    cache: Path, repo: str, files: dict[str, pa.Table | list[dict]], *, commit: str = COMMIT, ref: str = "main"
) -> Path:
    """A data set snapshot as `hf download --repo-type dataset` leaves it: refs/<ref> names the commit."""
    storage = cache / ("datasets--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    for name, rows in files.items():
        path = snapshot / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(rows, pa.Table):
            pq.write_table(rows, path)
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    add_dataset(
        cache,
        "rlvr-test/sums",
        {"main/train-00000-of-00001.parquet": table(12), "main/test-00000-of-00001.parquet": table(4, start=100)},
    )
    return cache


def write(tmp_path: Path, recipe: str = RECIPE) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(textwrap.dedent(recipe))
    return path


def test_the_config_and_splits_become_the_snapshots_files_and_the_columns_the_rows_fields(tmp_path: Path, cache: Path):
    recipe = load_recipe(write(tmp_path))
    snapshot = cache / "datasets--rlvr-test--sums" / "snapshots" / COMMIT / "main"
    assert recipe.domains["sums"].files == [str(snapshot / "train-00000-of-00001.parquet")]
    assert recipe.domains["sums"].eval_files == [str(snapshot / "test-00000-of-00001.parquet")]
    assert json.loads(resolved_json(recipe))["domains"]["sums"]["files"] == recipe.domains["sums"].files  # workers
    train, reports = load_recipe_domains(recipe)
    evals, _ = load_recipe_domains(recipe, eval_files=True)
    assert reports["sums"].loaded == 12 and len(evals["sums"]) == 4
    first = train["sums"][3]
    assert (first.tag, first.messages, first.ground_truth) == (
        "sums",
        [{"role": "user", "content": "What is 3 + 3?"}],
        "6",
    )
    assert first.extra == {}  # the mapped columns are the fields, not left in extra
    assert evals["sums"][0].ground_truth == "200"


def test_the_default_config_a_jsonl_layout_and_a_revision(tmp_path: Path, cache: Path):
    rows = [{"prompt": "What is 1 + 2?", "solution": "3"}]
    add_dataset(
        cache, "rlvr-test/plain", {"data/train-00000-of-00002.jsonl": rows, "data/train-00001-of-00002.jsonl": rows}
    )
    add_dataset(cache, "rlvr-test/plain", {"data/train.jsonl": rows * 3}, commit="d" * 40, ref="v2")
    recipe_text = RECIPE.replace("hf:rlvr-test/sums", "hf:rlvr-test/plain").replace('config = "main"\n', "")
    recipe_text = recipe_text.replace(
        'columns = { prompt = "question", ground_truth = "answer" }', 'columns = { ground_truth = "solution" }'
    )
    recipe_text = recipe_text.replace('eval_files = ["hf:rlvr-test/plain"]\n', "")
    recipe = load_recipe(write(tmp_path, recipe_text))
    assert len(recipe.domains["sums"].files) == 2 and len(load_recipe_domains(recipe)[0]["sums"]) == 2
    recipe = load_recipe(write(tmp_path, recipe_text), ['domains.sums.hf.revision="v2"'])
    samples = load_recipe_domains(recipe)[0]["sums"]
    assert len(samples) == 3 and samples[0].ground_truth == "3"


# -- rlvr validate: one line, the key, the fix -----------------------------------------------------
def error(tmp_path: Path, *sets: str) -> str:
    path = write(tmp_path)
    args = [x for s in sets for x in ("--set", s)]
    return one_error_line(runner.invoke(app, ["validate", str(path), *args])).replace(str(tmp_path), "TMP")


def test_validate_accepts_the_hub_recipe(tmp_path: Path, cache: Path):
    result = runner.invoke(app, ["validate", str(write(tmp_path))])
    assert result.exit_code == 0, result.output


def test_a_data_set_not_in_the_cache_names_the_id_and_the_download_command(tmp_path: Path, cache: Path, monkeypatch):
    assert error(tmp_path, 'domains.sums.files=["hf:rlvr-test/nope"]') == (
        "error: --set domains.sums.files: data set rlvr-test/nope is not in the hub cache TMP/hub (rlvr reads hub "
        "data sets from the cache only, and HF_HUB_OFFLINE=1 is set); fill it with: HF_HUB_OFFLINE=0 "
        "HF_HUB_CACHE=TMP/hub hf download rlvr-test/nope --repo-type dataset"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert error(tmp_path, 'domains.sums.hf.revision="v9"') == (
        "error: --set domains.sums.hf.revision: data set rlvr-test/sums at revision v9 is not in the hub cache "
        "TMP/hub (rlvr reads hub data sets from the cache only); fill it with: HF_HUB_OFFLINE=0 HF_HUB_CACHE=TMP/hub "
        "hf download rlvr-test/sums --revision v9 --repo-type dataset"
    )


def test_a_bad_column_map(tmp_path: Path, cache: Path):
    assert error(tmp_path, 'domains.sums.hf.columns={prompt = "questoin"}') == (
        "error: --set domains.sums.hf.columns: domains.sums.hf.columns.prompt: rlvr-test/sums has no column "
        "'questoin' (its columns: question, answer)"
    )
    assert error(tmp_path, 'domains.sums.hf.columns={ground_truth = "answer"}') == (
        "error: --set domains.sums.hf.columns: rlvr-test/sums has no prompt or messages column (its columns: "
        'question, answer); map one, e.g. columns = { prompt = "question" }'
    )
    assert error(tmp_path, 'domains.sums.hf.columns={answer = "answer"}') == (
        "error: --set domains.sums.hf.columns: domains.sums.hf.columns.answer: 'answer' is no row field; map "
        "columns to id, tag, messages, prompt, ground_truth, test_cases, case_type, difficulty"
    )


def test_a_config_or_split_the_data_set_lacks_lists_what_it_has(tmp_path: Path, cache: Path):
    snapshot = f"TMP/hub/datasets--rlvr-test--sums/snapshots/{COMMIT}"
    assert error(tmp_path, 'domains.sums.hf.config="other"') == (
        f"error: --set domains.sums.hf.config: rlvr-test/sums has no 'train' split of config 'other' in {snapshot} "
        "(configs: main; splits: test, train)"
    )
    assert error(tmp_path, 'domains.sums.hf.eval_split="validation"') == (
        f"error: --set domains.sums.hf.eval_split: rlvr-test/sums has no 'validation' split of config 'main' in "
        f"{snapshot} (configs: main; splits: test, train)"
    )
    add_dataset(cache, "rlvr-test/two", {"a/train-0.parquet": table(1), "b/train-0.parquet": table(1)})
    assert error(tmp_path, 'domains.sums.files=["hf:rlvr-test/two"]', "domains.sums.eval_files=[]") == (
        "error: TMP/recipe.toml:16: domains.sums.hf.config: rlvr-test/two has no 'train' split of config 'main' in "
        f"TMP/hub/datasets--rlvr-test--two/snapshots/{COMMIT} (configs: a, b; splits: train)"
    )


def test_validate_reads_the_hub_data_set_without_heavy_imports(tmp_path: Path, cache: Path):
    """Neither torch nor the hub's or datasets' packages (nor verifiers) are imported to read hf: files."""
    code = (
        "import sys; from rlvr.cli import app; "
        f"sys.argv=['rlvr', 'validate', {str(write(tmp_path))!r}];\n"
        "try:\n    app()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "heavy = [m for m in ('torch', 'transformers', 'huggingface_hub', 'datasets', 'verifiers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
