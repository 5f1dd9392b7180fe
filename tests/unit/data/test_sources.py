"""Rows in jsonl and parquet, messages as list or JSON string, bad rows with file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr.data.base import DataError, LoadReport
from rlvr.data.sources import load_domain_samples

ROWS = [
    {"id": "a", "tag": "math", "prompt": "1+1?", "ground_truth": "2", "difficulty": "1.0"},
    {
        "id": "b",
        "tag": "math",
        "messages": json.dumps([{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}]),
        "ground_truth": "4",
    },
    {"id": "c", "tag": "math", "messages": [{"role": "user", "content": "3+3?"}], "ground_truth": "6", "source": "x"},
]


def load(path: Path, **kwargs):
    return load_domain_samples([str(path)], domain="m", tags=["math"], reward="math_rule", **kwargs)


def test_jsonl_rows_become_samples(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    samples = load(path)
    assert [s.id for s in samples] == ["a", "b", "c"]
    assert samples[0].messages == [{"role": "user", "content": "1+1?"}]
    assert samples[1].prompt_text == "2+2?" and samples[1].messages[0]["role"] == "system"
    assert samples[0].difficulty == 1.0 and samples[0].domain == "m"
    assert samples[2].extra == {"source": "x"}


def test_parquet_rows_match_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    rows = [
        {
            **r,
            "messages": r.get("messages")
            if isinstance(r.get("messages"), str)
            else json.dumps(r.get("messages"))
            if r.get("messages")
            else None,
        }
        for r in ROWS
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    samples = load(path)
    assert [s.prompt_text for s in samples] == ["1+1?", "2+2?", "3+3?"]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (
            '{"id": 1, "tag": "math", "ground_truth": "1"}',
            "needs 'messages' (list or JSON string) or a non-empty 'prompt'",
        ),
        ('{"tag": "math", "messages": "[oops", "ground_truth": "1"}', "'messages' is a string but not JSON"),
        (
            '{"tag": "math", "messages": [{"role": "user"}], "ground_truth": "1"}',
            "messages[0].content must be a string",
        ),
        ('{"tag": "other", "prompt": "x", "ground_truth": "1"}', "tag 'other' is not owned by domain 'm'"),
        ('{"tag": "math", "prompt": "x", "ground_truth": "1", "difficulty": "hard"}', "'difficulty' must be a number"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"tag": "math", "prompt": "x"', "invalid JSON"),
    ],
)
def test_bad_row_names_file_line_and_reason(tmp_path: Path, row: str, reason: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + row + "\n")
    with pytest.raises(DataError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}:2: ")
    assert reason in str(info.value)


def test_skip_mode_counts(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\nnot json\n" + json.dumps(ROWS[2]) + "\n")
    report = LoadReport()
    samples = load(path, on_bad_row="skip", report=report)
    assert [s.id for s in samples] == ["a", "c"]
    assert report.skipped == 1 and report.first_skip.startswith(f"{path}:2:")


def test_filters_drop_rows(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({**r, "difficulty": d}) for r, d in zip(ROWS, [1, 5, 9], strict=True)))
    report = LoadReport()
    samples = load(path, min_difficulty=2, max_difficulty=8, report=report)
    assert [s.id for s in samples] == ["b"] and report.filtered == 2


def test_code_rows_decode_roll_json_test_cases(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    cases = [{"input": "1\n", "output": "1\n"}]
    path.write_text(
        json.dumps({"tag": "code", "prompt": "echo", "case_type": "stdin_stdout", "test_cases": json.dumps(cases)})
        + "\n"
    )
    [sample] = load_domain_samples([str(path)], domain="c", tags=["code"], reward="code_sandbox")
    assert sample.test_cases == cases and sample.case_type == "stdin_stdout"
    path.write_text(json.dumps({"tag": "code", "prompt": "echo", "case_type": "weird", "test_cases": "x"}) + "\n")
    with pytest.raises(DataError, match="'case_type' must be one of"):
        load_domain_samples([str(path)], domain="c", tags=["code"], reward="code_sandbox")


def test_unsupported_file_type(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported data file type '.csv'"):
        load(path)


def code_row(case_type: str, test_cases: object) -> str:
    return json.dumps({"tag": "code", "prompt": "f", "case_type": case_type, "test_cases": test_cases})


GOOD_CODE = code_row("assert", ["assert f(1) == 2"])


def test_code_rows_whose_test_cases_do_not_fit_their_case_type_name_file_line(tmp_path: Path) -> None:
    path = tmp_path / "code.jsonl"
    path.write_text("\n".join([GOOD_CODE] * 6 + [code_row("assert", {"f(1)": 2})]) + "\n")
    with pytest.raises(DataError) as info:
        load_domain_samples([str(path)], domain="c", tags=["code"], reward="code_sandbox")
    assert str(info.value) == (
        f"{path}:7: test_cases for case_type 'assert' must be a string or a non-empty list of strings (got dict)"
    )


def test_skip_mode_counts_code_rows_with_bad_test_cases(tmp_path: Path) -> None:
    path = tmp_path / "code.jsonl"
    path.write_text("\n".join([GOOD_CODE, code_row("check_based", {"test": "def check(c): pass"}), GOOD_CODE]) + "\n")
    report = LoadReport()
    samples = load_domain_samples(
        [str(path)], domain="c", tags=["code"], reward="code_sandbox", on_bad_row="skip", report=report
    )
    assert len(samples) == 2 and report.skipped == 1
    assert report.first_skip.startswith(f"{path}:2: test_cases for case_type 'check_based' must be an object")
    assert report.first_skip.endswith("(no 'entry_point')")


def test_test_cases_are_only_checked_for_code_sandbox(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({**ROWS[0], "case_type": "assert", "test_cases": {"a": 1}}) + "\n")
    assert len(load(path)) == 1  # a math row may carry any test_cases: math_rule never reads them


def test_a_plain_directory_is_not_a_data_file(tmp_path: Path) -> None:
    folder = tmp_path / "evals"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    expected = f"{folder} is a directory; expected a .jsonl/.json/.parquet file or a saved HF dataset folder"
    with pytest.raises(DataError) as info:
        load(folder)
    assert str(info.value) == expected + " (datasets' save_to_disk)"


def test_a_saved_hf_dataset_folder_is_read(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.Dataset.from_list([{k: v for k, v in ROWS[0].items()}]).save_to_disk(str(folder))
    assert [s.id for s in load(folder)] == ["a"]
    datasets.DatasetDict({"train": datasets.Dataset.from_list([ROWS[2]])}).save_to_disk(str(tmp_path / "dict"))
    assert [s.id for s in load(tmp_path / "dict")] == ["c"]
