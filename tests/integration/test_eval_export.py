"""`rlvr export` turns a DCP checkpoint into a HF folder with equal logits; `rlvr eval` scores it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.recipe.load import load_recipe, resolved_json

ROOT = Path(__file__).resolve().parents[2]


def make_run(tmp_path: Path, *overrides: str, lr_noise: float = 0.05) -> tuple[Path, torch.nn.Module]:
    """A run directory with the quickstart's resolved recipe and a checkpoint of perturbed weights."""
    from rlvr.trainer.checkpoint import save_checkpoint
    from rlvr.trainer.model import build_model

    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", ["trainer.strategy=none", *overrides])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "resolved_recipe.json").write_text(resolved_json(recipe))
    model = build_model(recipe.model, recipe.trainer, device=torch.device("cpu"), seed=0)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:  # what training moves (a LoRA model's adapters only)
                p.add_(torch.randn_like(p) * lr_noise)
    part = SimpleNamespace(model=model, optimizer=None, scheduler=None)
    save_checkpoint(run_dir / "checkpoints", 7, {"actor": part})
    return run_dir, model


def test_export_round_trips_logits(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    run_dir, model = make_run(tmp_path)
    out = tmp_path / "hf"
    result = CliRunner().invoke(app, ["export", str(run_dir / "checkpoints" / "step_7"), str(out)])
    assert result.exit_code == 0, result.output
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([[5, 17, 40, 33, 21, 9]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits, rtol=1e-5, atol=1e-5)
    assert (out / "tokenizer.json").exists()


def test_a_lora_run_exports_a_peft_adapter_or_with_merge_a_plain_model(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir, model = make_run(tmp_path, "trainer.lora.rank=4")
    policy = ROOT / "recipes" / "quickstart" / "policy"
    ids = torch.tensor([[5, 17, 40, 33, 21, 9]])
    with torch.no_grad():
        want = model.eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(policy).eval()(ids).logits
    assert not torch.allclose(want, base, atol=1e-3)  # the adapters change the model: the checks below see them
    step = str(run_dir / "checkpoints" / "step_7")
    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    for args in ([step, str(adapter)], [step, str(merged), "--merge"]):
        result = CliRunner().invoke(app, ["export", *args])
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    with torch.no_grad():
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(policy), adapter).eval()
        torch.testing.assert_close(peft_model(ids).logits, want, rtol=1e-5, atol=1e-5)
        plain = AutoModelForCausalLM.from_pretrained(merged).eval()
        torch.testing.assert_close(plain(ids).logits, want, rtol=1e-4, atol=1e-5)
    assert (merged / "tokenizer.json").exists()


def test_eval_scores_a_checkpoint_by_tag(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, lr_noise=0.0)
    rows = tmp_path / "rows.jsonl"
    data = ROOT / "recipes" / "quickstart" / "data"
    rows.write_text("".join((data / "math_eval.jsonl").read_text().splitlines(keepends=True)[:4]))
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            str(run_dir / "checkpoints" / "step_7"),
            "--data",
            str(rows),
            "--max-new-tokens",
            "16",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(scored) == 4 and {r["tag"] for r in scored} == {"math"}
    assert all(r["score"] in (0.0, 1.0) for r in scored)
    assert "math" in result.stdout and "all" in result.stdout


def test_eval_bad_input_is_one_line(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"tag": "x", "prompt": "1+1"}\n')
    result = CliRunner().invoke(app, ["eval", str(tmp_path), "--data", str(rows)])
    assert result.exit_code == 2 and "pass --reward NAME or --recipe" in result.stderr
    result = CliRunner().invoke(
        app, ["eval", str(tmp_path), "--data", str(tmp_path / "none.jsonl"), "--reward", "math_rule"]
    )
    assert result.exit_code == 2 and "no such data file" in result.stderr


def test_export_takes_a_run_directory_or_latest_and_writes_readable_weights(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path)
    for i, given in enumerate((run_dir, run_dir / "checkpoints" / "latest")):
        out = tmp_path / f"hf{i}"
        result = CliRunner().invoke(app, ["export", str(given), str(out)])
        assert result.exit_code == 0, result.output
        assert "step_7" in result.output and "Loading weights" not in result.output
        modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
        assert modes["model.safetensors"] == modes["config.json"], modes  # not 0600 beside 0644
    result = CliRunner().invoke(app, ["export", str(tmp_path / "none"), str(tmp_path / "x")])
    assert result.exit_code == 2 and "no complete checkpoint here" in result.stderr


def test_eval_exports_into_a_temporary_folder_it_removes_or_keeps_export_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    run_dir, _ = make_run(tmp_path, lr_noise=0.0)
    rows = tmp_path / "rows.jsonl"
    rows.write_text((ROOT / "recipes" / "quickstart" / "data" / "math_eval.jsonl").read_text().splitlines()[0] + "\n")
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--data", str(rows), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    # the recipe's response length (the quickstart's rollout.max_new_tokens), not a fixed 256
    assert f"max new tokens: 64 (rollout.max_new_tokens of {run_dir / 'resolved_recipe.json'}" in text
    assert "(removed after the eval; --export-dir DIR keeps it)" in text
    assert "Loading weights" not in result.output
    assert not (run_dir / "checkpoints" / "step_7" / "hf").exists()
    assert not any((tmp_path / "cache" / "rlvr" / "exports").iterdir())  # nothing left behind
    assert f"model: {run_dir / 'checkpoints' / 'step_7'}" in text
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["prompt"].endswith("assistant: ") and row["finish_reason"] in ("stop", "length")

    keep = tmp_path / "kept"
    args = ["eval", str(run_dir), "--data", str(rows), "--max-new-tokens", "4", "--export-dir", str(keep)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"exporting {run_dir / 'checkpoints' / 'step_7'} to {keep} (kept" in " ".join(result.stdout.split())
    assert (keep / "config.json").exists() and (keep / "tokenizer.json").exists()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert f"reusing the export of {run_dir / 'checkpoints' / 'step_7'} in {keep}" in " ".join(again.stdout.split())

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--data", str(rows), "--export-dir", str(other)])
    assert result.exit_code == 2, result.output
    assert " ".join(result.stderr.split()) == (
        f"error: --export-dir {other}: holds something other than an export of {run_dir / 'checkpoints' / 'step_7'}; "
        "expected a new or empty folder (or one an earlier eval of this checkpoint exported into)"
    )
    assert (other / "notes.txt").read_text() == "mine"


def test_eval_of_judge_rows_without_a_judge_stops_before_scoring(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RLVR_JUDGE_URL", raising=False)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"tag": "words", "prompt": "opposite of hot?", "ground_truth": "cold"}\n')
    model = ROOT / "recipes" / "quickstart" / "policy"
    result = CliRunner().invoke(app, ["eval", str(model), "--data", str(rows), "--reward", "llm_judge"])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert "rows tagged words are scored by llm_judge but no judge is set" in message
    assert "or use a recipe with a [judge] table" in message  # a recipe table, not rich markup
    result = CliRunner().invoke(
        app, ["eval", str(model), "--data", str(rows), "--reward", "math_rule", "--args", '{"timout_s": 1}']
    )
    assert result.exit_code == 2 and "--args: math_rule does not take 'timout_s'" in result.stderr


def test_eval_serves_the_recipes_judge_as_launch_does(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RLVR_JUDGE_URL", raising=False)
    rows = tmp_path / "rows.jsonl"
    rows.write_text((ROOT / "recipes" / "quickstart" / "data" / "words_eval.jsonl").read_text().splitlines()[0] + "\n")
    out = tmp_path / "scores.jsonl"
    model, recipe = ROOT / "recipes" / "quickstart" / "policy", ROOT / "recipes" / "quickstart.toml"
    args = [
        "eval",
        str(model),
        "--data",
        str(rows),
        "--recipe",
        str(recipe),
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "judge: serving" in result.stdout
    scored = json.loads(out.read_text().splitlines()[0])
    assert scored["reason"] in ("judge: reference", "unparsable judge answer", "empty response"), scored


def test_eval_ends_answers_where_rollout_does() -> None:
    """`rlvr eval` applies the recipe's rollout.stop: a few-shot base model's answer ends at the stop
    string, as in rollout, instead of running on into the next shot."""
    from rlvr.evaluation import evaluate, load_rows

    policy = ROOT / "recipes" / "quickstart" / "policy"
    (sample,) = load_rows([ROOT / "recipes" / "quickstart" / "data" / "math_eval.jsonl"], reward="math_rule",
                          tag_rewards={})[:1]  # fmt: skip
    rewards = {sample.tag: ("math_rule", {})}
    (free,) = evaluate(policy, [sample], rewards=rewards, max_new_tokens=24)
    cut = free.completion[len(free.completion) // 2]  # a character of the free answer, past its start
    (stopped,) = evaluate(policy, [sample], rewards=rewards, max_new_tokens=24, stop=[cut])
    assert cut not in stopped.completion and free.completion.startswith(stopped.completion)
    assert len(stopped.completion) < len(free.completion) and stopped.finish_reason == "stop"


def test_eval_of_tool_domain_rows_is_refused_unless_asked_for_without_tools(tmp_path: Path) -> None:
    """rlvr eval answers in one turn: a tool domain's rows would be scored with every call unanswered."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"tag": "products", "prompt": "What is 2 * 3?", "ground_truth": "6"}\n')
    recipe = ROOT / "recipes" / "smollm2_python_tool.toml"
    model = ROOT / "recipes" / "quickstart" / "policy"
    args = ["eval", str(model), "--data", str(rows), "--recipe", str(recipe), "--max-new-tokens", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert message.startswith("error: rows tagged products belong to a domain that calls tools") and "\n" not in (
        result.stderr.strip()
    )
    result = CliRunner().invoke(app, [*args, "--without-tools"])
    assert result.exit_code == 0, result.output
    assert "products" in result.output
