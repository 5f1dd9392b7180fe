"""Every shipped recipe validates; overrides apply; bad input gives one line, exit 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.recipe.load import RecipeError, load_recipe

from .helpers import MATH_ROWS, MINIMAL, one_error_line, write_recipe

ROOT = Path(__file__).resolve().parents[3]
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))
runner = CliRunner()


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_validates(recipe: Path) -> None:
    result = runner.invoke(app, ["validate", str(recipe)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.stdout


def test_flagship_is_multi_task_grpo_on_slurm() -> None:
    recipe = load_recipe(ROOT / "recipes" / "math_code_judge.toml")
    assert recipe.data.domain_interleave_probs == {"math": 0.6, "code": 0.3, "general": 0.1}
    assert {d.reward for d in recipe.domains.values()} == {"math_rule", "code_sandbox", "llm_judge"}
    assert recipe.algorithm.preset == "grpo" and recipe.cluster.kind == "slurm" and recipe.cluster.nodes >= 2


def test_overrides_parse_toml_values_and_strings(tmp_path: Path) -> None:
    path = write_recipe(tmp_path)
    recipe = load_recipe(
        path, ["rollout.n=16", "algorithm.preset=dapo", "experiment.name=run-7", 'rollout.stop=["\\n\\n"]']
    )
    assert recipe.rollout.n == 16
    assert recipe.experiment.name == "run-7"
    assert recipe.rollout.stop == ["\n\n"]
    assert recipe.algorithm.dynamic_sampling is True and recipe.algorithm.clip_ratio_high == 0.28


def test_recipe_knob_beats_preset(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path), ["algorithm.preset=gspo", "algorithm.clip_ratio_high=0.001"])
    assert recipe.algorithm.importance_level == "sequence"
    assert recipe.algorithm.clip_ratio_high == 0.001


def test_data_paths_resolve_relative_to_the_recipe(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path))
    assert recipe.domains["math"].files == [str((tmp_path / "math.jsonl").resolve())]


BAD_CASES = {
    "async without an importance cap": (
        MINIMAL.replace("n = 2", "n = 2\nmax_staleness = 1"),
        "recipe.toml:25: rollout.max_staleness: asynchronous rollout trains on older weights' samples: set "
        "algorithm.tis_cap",
    ),
    "staleness in the wrong table": (
        MINIMAL + "\n[sync]\nmax_staleness = 1\n",
        "recipe.toml:28: sync.max_staleness: unknown key; known keys: method, bucket_mb",
    ),
    "unknown key": (
        MINIMAL.replace("temperature = 0.7", "temprature = 0.7"),
        "recipe.toml:25: rollout.temprature: unknown key; did you mean 'temperature'?",
    ),
    "wrong type": (
        MINIMAL.replace("n = 2", 'n = "many"'),
        "recipe.toml:24: rollout.n: Input should be a valid integer",
    ),
    "probs sum": (
        MINIMAL.replace("code = 0.25", "code = 0.5"),
        "recipe.toml:11: data.domain_interleave_probs: values must sum to 1, got 1.25",
    ),
    "probs unknown domain": (
        MINIMAL.replace("code = 0.25", "cod = 0.25"),
        "data.domain_interleave_probs: unknown domain 'cod' (did you mean 'code'?); expected the recipe's domains "
        "['code', 'math']",
    ),
    "missing data file": (
        MINIMAL.replace('files = ["{code}"]', 'files = ["nope.jsonl"]'),
        "recipe.toml:20: domains.code.files: no such data file 'nope.jsonl'",
    ),
    "gae without critic": (
        MINIMAL + '\n[algorithm]\nadvantage = "gae"\n',
        "algorithm: advantage = 'gae' needs critic = true",
    ),
    "unknown preset": (
        MINIMAL + '\n[algorithm]\npreset = "grpoo"\n',
        "recipe.toml:28: algorithm.preset: unknown preset 'grpoo'",
    ),
    "missing model": (MINIMAL.replace("config = {{ hidden_size = 32 }}", ""), "model: set exactly one of model.path"),
    "invalid toml": (MINIMAL + "\n[rollout\n", "invalid TOML"),
    "tag owned twice": (
        MINIMAL.replace('tags = ["code"]', 'tags = ["math"]'),
        "domains.code.tags: tag 'math' is already owned by domain 'math'",
    ),
    "reward arg typo": (
        MINIMAL.replace('reward = "math_rule"', 'reward = "math_rule"\nreward_args = {{ timout_s = 3 }}'),
        "recipe.toml:17: domains.math.reward_args: math_rule does not take 'timout_s' (did you mean 'timeout_s'?)",
    ),
    "unknown reward": (
        MINIMAL.replace('reward = "math_rule"', 'reward = "math_rules"'),
        "recipe.toml:16: domains.math.reward: unknown reward 'math_rules'",
    ),
    "in-process sync on a launched run": (
        MINIMAL + '\n[sync]\nmethod = "inprocess"\n',
        "sync.method: inprocess needs the embedded engine inside the trainer process",
    ),
    "slurm split": (
        MINIMAL + '\n[cluster]\nkind = "slurm"\nnodes = 1\n',
        "cluster: trainer_nodes (1) must be less than nodes (1)",
    ),
    # Start-up checks of the worker, run by validate (issue 18): each used to pass validate and fail in launch.
    "quoted number": (
        MINIMAL + '\n[trainer]\nlr = "2e-4"\n',
        "recipe.toml:28: trainer.lr: Input should be a valid number (got '2e-4'); write it without quotes",
    ),
    "quoted timeout": (
        MINIMAL.replace("n = 2", 'n = 2\ntimeout_s = "5"'),
        "recipe.toml:25: rollout.timeout_s: Input should be a valid number (got '5')",
    ),
    "format weight above 1": (
        MINIMAL.replace('reward = "math_rule"', 'reward = "math_rule"\nreward_args = {{ format_weight = 1.5 }}'),
        "recipe.toml:17: domains.math.reward_args: format_weight: expected a number in [0, 1], got 1.5",
    ),
    "quoted reward timeout": (
        MINIMAL.replace('reward = "math_rule"', 'reward = "math_rule"\nreward_args = {{ timeout_s = "5" }}'),
        "domains.math.reward_args: timeout_s: expected a number > 0, got '5'",
    ),
    "judge template placeholder": (
        MINIMAL.replace(
            'reward = "code_sandbox"', 'reward = "llm_judge"\nreward_args = {{ template = "{{prompt}} {{answer}}" }}'
        ),
        "recipe.toml:22: domains.code.reward_args: template: unknown placeholder {answer}; a template may use",
    ),
    "judge reference without ground truth": (
        MINIMAL.replace('reward = "code_sandbox"', 'reward = "llm_judge"\nreward_args = {{ template = "reference" }}'),
        "code.jsonl:1: llm_judge rows need 'ground_truth' (template 'reference')",
    ),
    "eval rows checked like training rows": (
        MINIMAL.replace('reward = "math_rule"', 'reward = "math_rule"\neval_files = ["{code}"]'),
        "code.jsonl:1: math_rule rows need 'ground_truth'",
    ),
    "hub id as model path, not in the hub cache, offline": (  # tests run with HF_HUB_OFFLINE=1 (tests/conftest.py)
        MINIMAL.replace("config = {{ hidden_size = 32 }}", 'path = "rlvr-test/in-no-cache"'),
        "recipe.toml:7: model.path: rlvr-test/in-no-cache is neither a folder (a relative path starts at the "
        "recipe's folder) nor in the hub cache",
    ),
    "missing model folder": (
        MINIMAL.replace("config = {{ hidden_size = 32 }}", 'path = "./models/policy"'),
        "recipe.toml:7: model.path: no model folder './models/policy' (a relative path starts at the recipe's folder)",
    ),
    "missing tokenizer folder": (
        MINIMAL.replace("config = {{ hidden_size = 32 }}", 'config = {{ hidden_size = 32 }}\ntokenizer = "tok"'),
        "recipe.toml:8: model.tokenizer: no tokenizer folder at tok (a relative path starts at the recipe's folder)",
    ),
    "more ranks than the machine": (
        MINIMAL + '\n[trainer]\nranks = 4096\nstrategy = "fsdp2"\n',
        "recipe.toml:28: trainer.ranks: 4096 trainer ranks but this machine has",
    ),
    # Accepted silently before issue 23: a run that trains on nothing, or dies past the model's context.
    "grpo with one sample per prompt": (
        MINIMAL.replace("n = 2", "n = 1"),
        "recipe.toml:24: rollout.n: algorithm.advantage = 'grpo' compares the n samples of a prompt: with n = 1 every "
        "sample's advantage is 0 and nothing is learned; set rollout.n >= 2 (e.g. 8)",
    ),
    "rloo preset with one sample per prompt": (
        MINIMAL.replace("n = 2", "n = 1") + '\n[algorithm]\npreset = "rloo"\n',
        "recipe.toml:24: rollout.n: algorithm.advantage = 'rloo' compares the n samples of a prompt",
    ),
    "reinforce with group std and one sample": (
        MINIMAL.replace("n = 2", "n = 1") + '\n[algorithm]\nadvantage = "reinforce"\n',
        "recipe.toml:24: rollout.n: algorithm.advantage = 'reinforce' with adv_std_norm = 'group' compares the n "
        "samples of a prompt",
    ),
    "greedy grpo": (
        MINIMAL.replace("temperature = 0.7", "temperature = 0.0"),
        "recipe.toml:25: rollout.temperature: 0 samples greedily, so the 2 samples of a prompt are identical and "
        "algorithm.advantage = 'grpo' gives each a zero advantage; set rollout.temperature > 0 (e.g. 1.0)",
    ),
    "dr_grpo greedy": (
        MINIMAL.replace("temperature = 0.7", "temperature = 0") + '\n[algorithm]\npreset = "dr_grpo"\n',
        "recipe.toml:25: rollout.temperature: 0 samples greedily, so the 2 samples of a prompt are identical and "
        "algorithm.advantage = 'dr_grpo' gives each a zero advantage",
    ),
    "prompt and response beyond the model's context": (
        MINIMAL.replace("hidden_size = 32", "hidden_size = 32, max_position_embeddings = 1024"),
        "recipe.toml:23: rollout.max_new_tokens: data.max_prompt_tokens + rollout.max_new_tokens = 1024 + 512 = 1536 "
        "tokens is more than the model's context (max_position_embeddings = 1024); lower one of them",
    ),
    "lora on torchtitan": (
        MINIMAL.replace("config = {{", 'impl = "torchtitan"\nconfig = {{') + "\n[trainer.lora]\nrank = 8\n",
        "trainer.lora.rank: LoRA runs on model.impl = 'hf' (peft adapts transformers' linear layers",
    ),
    "lora adapters pushed to sglang": (
        MINIMAL.replace("n = 2", 'n = 2\nengine = "sglang"') + "\n[trainer.lora]\nrank = 8\n",
        "sync.lora: 'adapter' needs an engine that merges pushed adapters (rlvr serve, vllm); SGLang takes full "
        "weights: set sync.lora = 'merged'",
    ),
}

GOOD_CASES = {
    "ppo with one sample per prompt (gae judges each sample on its own)": (
        MINIMAL.replace("n = 2", "n = 1") + '\n[algorithm]\npreset = "ppo"\n'
    ),
    "raw reinforce, greedy": (
        MINIMAL.replace("temperature = 0.7", "temperature = 0.0") + '\n[algorithm]\npreset = "topr"\n'
    ),
    "context that fits": MINIMAL.replace("hidden_size = 32", "hidden_size = 32, max_position_embeddings = 1536"),
}


@pytest.mark.parametrize("case", GOOD_CASES, ids=list(GOOD_CASES))
def test_recipes_near_the_new_rules_stay_valid(tmp_path: Path, case: str, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path, GOOD_CASES[case]))])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("case", BAD_CASES, ids=list(BAD_CASES))
def test_bad_recipe_gives_one_clear_line_and_exit_2(tmp_path: Path, case: str, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the machine checks see a CPU-only machine, GPU box or not
    body, expected = BAD_CASES[case]
    path = write_recipe(tmp_path, body)
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert expected in message, message
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


OVERRIDE_CASES = {
    "wrong type": (["rollout.n=many"], "--set rollout.n: Input should be a valid integer (got 'many')"),
    "unknown key": (["rollout.temprature=0.5"], "--set rollout.temprature: unknown key; did you mean 'temperature'?"),
    "probs sum": (
        ["data.domain_interleave_probs.code=0.5"],
        "--set data.domain_interleave_probs.code: data.domain_interleave_probs: values must sum to 1, got 1.25",
    ),
    "reward arg": (["domains.math.reward_args.format_weight=2"], "--set domains.math.reward_args.format_weight:"),
    "more ranks": (["trainer.ranks=4096"], "--set trainer.ranks: 4096 trainer ranks but this machine has"),
    "quoted number": (
        ['rollout.n="4"'],
        "--set rollout.n: Input should be a valid integer (got '4'); write it without quotes",
    ),
    "not a bool": (["monitor.tensorboard=yes"], "(got 'yes'); write true or false"),
    "an engine's own budget": (
        ["rollout.engine=sglang", "rollout.kv_cache_gb=2"],
        "--set rollout.kv_cache_gb: the embedded engine's KV budget; for sglang set rollout.sglang.mem_fraction_static",
    ),
    "a table's check": (
        ["cluster.kind=slurm", "cluster.gpus_per_node=8"],
        "--set cluster.kind, cluster.gpus_per_node: cluster: trainer_nodes (1) must be less than nodes (1)",
    ),
}


def test_a_wrong_value_written_without_quotes_is_not_told_to_drop_quotes(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path)), "--set", "rollout.n==4"])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert "(got '=4')" in message and "quotes" not in message, message


def test_help_naming_a_recipe_table_prints_its_brackets() -> None:
    help_text = " ".join(runner.invoke(app, ["eval", "--help"]).output.split())
    assert "the recipe's [judge]" in help_text


@pytest.mark.parametrize("case", OVERRIDE_CASES, ids=list(OVERRIDE_CASES))
def test_bad_override_names_set_key_not_a_toml_line(tmp_path: Path, case: str) -> None:
    overrides, expected = OVERRIDE_CASES[case]
    args = ["validate", str(write_recipe(tmp_path))] + [arg for item in overrides for arg in ("--set", item)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert expected in message and "recipe.toml:" not in message, message


def test_probabilities_rounded_to_thirds_are_accepted_and_normalised(tmp_path: Path) -> None:
    body = MINIMAL.replace("math = 0.75, code = 0.25", "math = 0.333, code = 0.333, more = 0.333").replace(
        "[rollout]", '[domains.more]\ntags = ["more"]\nfiles = ["more.jsonl"]\nreward = "math_rule"\n\n[rollout]'
    )
    path = write_recipe(tmp_path, body)
    (tmp_path / "more.jsonl").write_text(MATH_ROWS[0].replace('"math"', '"more"') + "\n")
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    probs = load_recipe(path).data.domain_interleave_probs
    assert probs["math"] == pytest.approx(1 / 3) and sum(probs.values()) == pytest.approx(1.0)


def test_bad_json_row_names_file_and_line(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, math_rows=[MATH_ROWS[0], '{"id": "m2", "tag": "math", "prompt": ', MATH_ROWS[1]])
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert f"{tmp_path / 'math.jsonl'}:2: invalid JSON" in " ".join(result.stderr.split())


def test_bad_row_fields_name_the_reason(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, math_rows=[MATH_ROWS[0], '{"id": "m2", "tag": "math", "prompt": "x"}'])
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "math.jsonl:2: math_rule rows need 'ground_truth'" in " ".join(result.stderr.split())


def test_skip_mode_counts_bad_rows_instead(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, math_rows=[MATH_ROWS[0], "not json", MATH_ROWS[1]])
    result = runner.invoke(app, ["plan", str(path), "--set", "data.on_bad_row=skip", "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    resolved = json.loads((tmp_path / "r.json").read_text())
    assert resolved["data"]["on_bad_row"] == "skip"


def test_bad_override_syntax(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path)), "--set", "rollout.n"])
    assert result.exit_code == 2
    assert "expected KEY.PATH=VALUE" in result.stderr


def test_missing_recipe_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path / "none.toml")])
    assert result.exit_code == 2
    assert "no such recipe file" in result.stderr


def test_plan_writes_resolved_json_with_every_knob(tmp_path: Path) -> None:
    out = tmp_path / "resolved.json"
    result = runner.invoke(app, ["plan", str(ROOT / "recipes" / "math_code_judge.toml"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    resolved = json.loads(out.read_text())
    assert resolved["algorithm"]["kl_estimator"] == "k3"
    assert resolved["algorithm"]["clip_ratio_high"] == 0.28
    assert "8 rank(s)" in result.stdout and "rollout 7 (sglang)" in result.stdout
    # The resolved JSON is a complete recipe: it loads back to the same thing.
    from rlvr.recipe.load import recipe_from_json

    assert recipe_from_json(out.read_text()).model_dump(mode="json") == resolved


@pytest.mark.parametrize("recipe", ["math_code_judge.toml", "quickstart.toml"])
def test_cli_is_fast_and_torch_free(recipe: str) -> None:
    """`rlvr validate` and `--help` must not import torch (they run on login nodes), with the
    machine checks of a local recipe (model folder, ranks) as well as a SLURM one."""
    code = (
        "import sys; from rlvr.cli import app; "
        f"sys.argv=['rlvr', 'validate', 'recipes/{recipe}'];\n"
        "try:\n    app()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, timeout=60)


def test_real_process_exit_code_and_no_traceback(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, MINIMAL.replace("n = 2", "n = -3"))
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "rollout.n" in proc.stderr and "Traceback" not in proc.stderr


def test_load_recipe_raises_recipe_error_not_validation_error(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="rollout.top_p"):
        load_recipe(write_recipe(tmp_path, MINIMAL.replace("n = 2", "top_p = 2.0")))


def test_launch_refuses_a_missing_resume_path_before_starting_anything(tmp_path: Path) -> None:
    recipe = ROOT / "recipes" / "quickstart.toml"
    args = ["launch", str(recipe), "--set", f"experiment.output_dir={json.dumps(str(tmp_path))}"]
    result = runner.invoke(app, [*args, "--resume", str(tmp_path / "nope"), "--no-dashboard"])
    assert result.exit_code == 2, result.output
    assert f"--resume {tmp_path / 'nope'}: no such path" in " ".join(result.stderr.split())
    assert not (tmp_path / "quickstart").exists()  # no run directory, no process


def test_launch_runs_the_validate_checks_first(tmp_path: Path) -> None:
    recipe = ROOT / "recipes" / "quickstart.toml"
    args = ["launch", str(recipe), "--set", f"experiment.output_dir={json.dumps(str(tmp_path))}"]
    result = runner.invoke(app, [*args, "--set", "trainer.ranks=4096", "--no-dashboard"])
    assert result.exit_code == 2, result.output
    assert "--set trainer.ranks: 4096 trainer ranks" in " ".join(result.stderr.split())
    assert not (tmp_path / "quickstart").exists()


def test_help_names_values_plainly_and_shows_examples_and_version() -> None:
    """What `rlvr` (the installed entry point, `rlvr.cli:main`) prints, not typer's test runner."""

    def rlvr(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "rlvr.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    for command in ("validate", "plan", "launch", "sbatch", "eval", "export", "monitor", "serve"):
        text = rlvr(command, "--help")
        assert not any(mark in text for mark in ("<bool>", "<int>", "<path>", "<list[", "{RECIPE}", "{recipe}")), text
        assert "Example:" in text, command
    assert "KEY=VALUE" in rlvr("launch", "--help")
    assert rlvr("--version").startswith("rlvr ")


def test_a_relative_tokenizer_folder_starts_at_the_recipes_folder(tmp_path: Path, monkeypatch) -> None:
    """As model.path and data files: validating from another directory finds the same folder."""
    path = write_recipe(
        tmp_path,
        MINIMAL.replace("config = {{ hidden_size = 32 }}", 'config = {{ hidden_size = 32 }}\ntokenizer = "tok"'),
    )
    (tmp_path / "tok").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_recipe(path).model.tokenizer == str((tmp_path / "tok").resolve())


def test_validate_says_what_staleness_asks_of_the_lr() -> None:
    args = ["validate", str(ROOT / "recipes" / "quickstart.toml"), "--set", "rollout.max_staleness=1"]
    result = runner.invoke(app, [*args, "--set", "algorithm.tis_cap=2"])
    assert result.exit_code == 0, result.output
    assert "warning: rollout.max_staleness = 1 with trainer.lr = 0.0002" in " ".join(result.stderr.split())
    result = runner.invoke(app, [*args, "--set", "algorithm.tis_cap=2", "--set", "trainer.lr=1e-4"])
    assert result.exit_code == 0 and "warning: rollout.max_staleness" not in result.stderr


def test_lora_targets_are_checked_against_the_models_layers() -> None:
    recipe = str(Path(__file__).resolve().parents[3] / "recipes" / "quickstart.toml")
    sets = ["--set", "trainer.lora.rank=8", "--set", 'trainer.lora.target_modules=["q_proj","qkv"]']
    line = one_error_line(runner.invoke(app, ["validate", recipe, *sets]))
    assert line.endswith(
        "--set trainer.lora.target_modules: no linear layer named ['qkv'] in the model's blocks; it has "
        "['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj']"
    ), line
    sets[-1] = 'trainer.lora.target_modules=["q_proj","v_proj"]'
    assert runner.invoke(app, ["validate", recipe, *sets]).exit_code == 0


def test_eval_at_start_needs_eval_rows() -> None:
    recipe = str(ROOT / "recipes" / "quickstart.toml")
    no_evals = [arg for name in ("math", "code", "words") for arg in ("--set", f"domains.{name}.eval_files=[]")]
    line = one_error_line(runner.invoke(app, ["validate", recipe, "--set", "experiment.eval_at_start=true", *no_evals]))
    assert line.endswith(
        "--set experiment.eval_at_start: needs eval rows, and no domain has any: give a domain eval_files "
        "(or its gym table an eval_size)"
    ), line
    assert runner.invoke(app, ["validate", recipe, "--set", "experiment.eval_at_start=true"]).exit_code == 0
    line = one_error_line(runner.invoke(app, ["validate", recipe, *no_evals]))  # the quickstart evaluates every 25
    assert line.endswith(
        "experiment.eval_steps: evaluates every few steps, and no domain has eval rows: give a domain eval_files "
        "(or its gym table an eval_size), or set eval_steps = 0"
    ), line
    assert runner.invoke(app, ["validate", recipe, "--set", "experiment.eval_steps=0", *no_evals]).exit_code == 0
