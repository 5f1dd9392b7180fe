"""Hub ids as model paths (`rlvr.recipe.hub`): resolved once, while the recipe loads, to a snapshot
folder of the hub cache, which the resolved recipe then holds for every process.

No network: the cache is built under tmp in huggingface_hub's own layout
(`models--org--name/refs/main` holding a commit, `snapshots/<commit>/` the files), holding a copy
of the quickstart policy; the "online" cases replace huggingface_hub's download functions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.recipe.load import RecipeError, load_recipe, load_recipe_with_hub

from .helpers import one_error_line, write_recipe
from .test_model_and_rows import FOLDER

ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "recipes" / "quickstart" / "policy"
REPO = "rlvr-test/tiny-policy"
MAIN = "a" * 40  # refs/main
V1 = "b" * 40  # refs/v1
runner = CliRunner()

HUB = FOLDER.replace('path = "policy"', f'path = "{REPO}"')  # the unit recipes' model, as a hub id


def add_snapshot(cache: Path, repo: str, commit: str, *, ref: str | None = "main", files: Path | None = POLICY) -> Path:
    """A snapshot in the hub cache's layout (`refs/<ref>` names the commit when `ref` is given)."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    folder = storage / "snapshots" / commit
    if files is not None:
        shutil.copytree(files, folder)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    if ref is not None:
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return folder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    """HF_HOME under tmp, offline, holding REPO at main and at v1."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))  # validate adds the recipe's folder for plug-ins
    monkeypatch.delenv("RLVR_PLUGIN_PATH", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = tmp_path / "hf" / "hub"
    add_snapshot(hub, REPO, MAIN)
    add_snapshot(hub, REPO, V1, ref="v1")
    return hub


def snapshot(cache: Path, commit: str = MAIN, repo: str = REPO) -> Path:
    return cache / ("models--" + repo.replace("/", "--")) / "snapshots" / commit


def recipe_in(tmp_path: Path, body: str = HUB) -> Path:
    folder = tmp_path / "recipe"
    folder.mkdir(exist_ok=True)
    return write_recipe(folder, body)


def cli(command: str, path: Path, *overrides: str):
    args = [command, str(path), *[a for item in overrides for a in ("--set", item)]]
    if command == "plan":
        args += ["--out", str(path.parent / "resolved.json")]
    return runner.invoke(app, args)


def test_the_layout_is_the_hubs_own(cache: Path) -> None:
    """huggingface_hub itself finds the test cache's snapshots where rlvr does."""
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    assert try_to_load_from_cache(REPO, "config.json", cache_dir=cache) == str(snapshot(cache) / "config.json")
    assert snapshot_download(REPO, cache_dir=cache, local_files_only=True) == str(snapshot(cache))
    assert snapshot_download(REPO, cache_dir=cache, revision="v1", local_files_only=True) == str(snapshot(cache, V1))


def test_validate_and_plan_use_the_cached_snapshot(tmp_path: Path, cache: Path) -> None:
    path = recipe_in(tmp_path)
    line = f"model.path: {REPO} @ main -> {snapshot(cache)} (cached)"
    result = cli("validate", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [line, f"{path}: ok"]
    result = cli("plan", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == line
    resolved = json.loads((path.parent / "resolved.json").read_text())
    assert resolved["model"]["path"] == str(snapshot(cache))  # what every process reads


def test_an_uncached_id_offline_is_one_line_with_the_command_that_fills_the_cache(tmp_path: Path, cache: Path) -> None:
    path = recipe_in(tmp_path, HUB.replace(REPO, "rlvr-test/not-cached"))
    for command in ("validate", "plan"):
        line = one_error_line(cli(command, path))
        assert line == (
            f"error: {path}:7: model.path: rlvr-test/not-cached is neither a folder (a relative path starts at the "
            f"recipe's folder) nor in the hub cache {cache}, and HF_HUB_OFFLINE=1 forbids downloading it; fill the "
            f"cache with: HF_HUB_OFFLINE=0 HF_HOME={cache.parent} hf download rlvr-test/not-cached"
        )


def test_an_uncached_revision_names_it_in_the_command(tmp_path: Path, cache: Path) -> None:
    path = recipe_in(tmp_path)
    line = one_error_line(cli("validate", path, "model.revision=v2"))
    assert line.startswith(f"error: {path}:7: model.path: {REPO} is neither a folder")
    assert f"nor in the hub cache {cache} at revision v2, and HF_HUB_OFFLINE=1" in line
    assert line.endswith(
        f"fill the cache with: HF_HUB_OFFLINE=0 HF_HOME={cache.parent} hf download {REPO} --revision v2"
    )


def test_revision_picks_the_snapshot(tmp_path: Path, cache: Path) -> None:
    path = recipe_in(tmp_path)
    assert load_recipe(path).model.path == str(snapshot(cache))
    assert load_recipe(path, ["model.revision=v1"]).model.path == str(snapshot(cache, V1))
    pinned = "c" * 40  # a commit needs no ref
    add_snapshot(cache, REPO, pinned, ref=None)
    recipe, found = load_recipe_with_hub(path, [f"model.revision={pinned}"])
    assert recipe.model.path == str(snapshot(cache, pinned)) and recipe.model.revision == pinned
    assert [s.line() for s in found] == [f"model.path: {REPO} @ {pinned} -> {snapshot(cache, pinned)} (cached)"]


def test_a_revision_without_a_hub_id_is_refused(tmp_path: Path, cache: Path) -> None:
    path = recipe_in(tmp_path, FOLDER)
    shutil.copytree(POLICY, path.parent / "policy")
    line = one_error_line(cli("validate", path, "model.revision=v1"))
    assert line == (
        "error: --set model.revision: a revision picks a hub snapshot, but model.path 'policy' is no hub id "
        "(a folder there wins); remove it"
    )


def test_a_local_folder_wins_over_the_hub_id(tmp_path: Path, cache: Path) -> None:
    path = recipe_in(tmp_path)
    local = path.parent / REPO
    shutil.copytree(POLICY, local)
    result = cli("validate", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"{path}: ok"]  # no hub line: the hub is not asked
    assert load_recipe(path).model.path == str(local)


def test_tokenizer_and_judge_ids_resolve_too(tmp_path: Path, cache: Path) -> None:
    judge = "rlvr-test/tiny-judge"
    add_snapshot(cache, judge, "d" * 40, files=ROOT / "recipes" / "quickstart" / "judge")
    body = HUB.replace(f'path = "{REPO}"', f'path = "{REPO}"\ntokenizer = "{REPO}"') + f'\n[judge]\nmodel = "{judge}"\n'
    path = recipe_in(tmp_path, body)
    result = cli("validate", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:3] == [
        f"model.path: {REPO} @ main -> {snapshot(cache)} (cached)",
        f"model.tokenizer: {REPO} @ main -> {snapshot(cache)} (cached)",
        f"judge.model: {judge} @ main -> {snapshot(cache, 'd' * 40, judge)} (cached)",
    ]
    recipe = load_recipe(path)
    assert (recipe.model.tokenizer, recipe.judge and recipe.judge.model) == (
        str(snapshot(cache)),
        str(snapshot(cache, "d" * 40, judge)),
    )


def test_slurm_refuses_a_node_local_hub_cache(tmp_path: Path, cache: Path) -> None:
    slurm = HUB + '\n[cluster]\nkind = "slurm"\nnodes = 2\n'
    line = one_error_line(cli("plan", recipe_in(tmp_path, slurm)))
    assert line == (
        f"error: {tmp_path / 'recipe' / 'recipe.toml'}:7: model.path: hub id {REPO} would be read from the hub cache "
        f"{cache}, which is node-local (/tmp): the SLURM nodes cannot see it; set HF_HOME to a folder every node "
        "sees (export HF_HOME=/shared/huggingface)"
    )


def test_slurm_plan_names_the_shared_hub_cache(tmp_path: Path, cache: Path, monkeypatch) -> None:
    import rlvr.recipe.plan

    monkeypatch.setattr(rlvr.recipe.plan, "NODE_LOCAL", ("/var/tmp",))  # this test's cache stands for a shared one
    result = cli("plan", recipe_in(tmp_path, HUB + '\n[cluster]\nkind = "slurm"\nnodes = 2\n'))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:2] == [
        f"model.path: {REPO} @ main -> {snapshot(cache)} (cached)",
        f"hub cache: {cache} (the SLURM nodes read the snapshots there; HF_HOME moves it)",
    ]


def fake_config_download(cache: Path, calls: list):
    """huggingface_hub.hf_hub_download as the hub answers it for config.json: the file lands in a
    new snapshot folder, refs/main names the commit."""

    def download(repo_id, filename, *, revision=None, cache_dir="", **kwargs):
        calls.append((repo_id, filename, revision))
        assert Path(cache_dir) == cache
        folder = add_snapshot(cache, repo_id, "e" * 40, ref=revision or "main", files=None)
        (folder / filename).write_text((POLICY / "config.json").read_text())
        return str(folder / filename)

    return download


def test_online_validate_and_plan_fetch_config_json_alone(tmp_path: Path, cache: Path, monkeypatch) -> None:
    import huggingface_hub

    def no_snapshot(*args, **kwargs):
        raise AssertionError("validate and plan never download the weights")

    calls: list = []
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_config_download(cache, calls))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_snapshot)
    path = recipe_in(tmp_path, HUB.replace(REPO, "rlvr-test/remote"))
    folder = snapshot(cache, "e" * 40, "rlvr-test/remote")
    line = f"model.path: rlvr-test/remote @ main -> {folder} (only config.json fetched; rlvr launch downloads the rest)"
    result = cli("validate", path)
    assert result.exit_code == 0, result.output  # no weights, no tokenizer yet: left to launch
    assert result.stdout.splitlines() == [line, f"{path}: ok"]
    result = cli("plan", path, "cluster.gpus_per_node=1", "cluster.gpu_memory_gb=80", "rollout.colocate=true")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == line
    assert "Memory per GPU (estimate; 80.0 GiB per GPU (cluster.gpu_memory_gb))" in result.stdout
    assert calls == [("rlvr-test/remote", "config.json", "main")] * 2
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # config.json alone is not a cached model
    assert one_error_line(cli("validate", path)) == (
        f"error: {path}:7: model.path: the hub cache {cache} holds rlvr-test/remote without its weights ({folder}), "
        f"and HF_HUB_OFFLINE=1 forbids downloading them; fill the cache with: HF_HUB_OFFLINE=0 HF_HOME={cache.parent} "
        "hf download rlvr-test/remote"
    )


def test_launch_downloads_the_snapshot_before_anything_starts(tmp_path: Path, cache: Path, monkeypatch) -> None:
    import huggingface_hub

    calls: list = []

    def snapshot_download(repo_id, *, revision, cache_dir, ignore_patterns):
        calls.append((repo_id, revision, ignore_patterns))
        return str(add_snapshot(Path(cache_dir), repo_id, "f" * 40, ref=revision))

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo_id, revision: ["model.safetensors", "x.bin"])
    said: list[str] = []
    path = recipe_in(tmp_path, HUB.replace(REPO, "rlvr-test/remote"))
    recipe, found = load_recipe_with_hub(path, hub="download", announce=said.append)
    folder = snapshot(cache, "f" * 40, "rlvr-test/remote")
    assert recipe.model.path == str(folder)
    assert said == [f"downloading rlvr-test/remote @ main into {cache} (once, before anything starts)"]
    assert [s.line() for s in found] == [f"model.path: rlvr-test/remote @ main -> {folder} (downloaded)"]
    assert calls[0][:2] == ("rlvr-test/remote", "main") and "*.bin" in calls[0][2]  # safetensors: no pickles too


def test_a_hub_error_is_one_line(tmp_path: Path, cache: Path, monkeypatch) -> None:
    import httpx
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    def missing(*args, **kwargs):
        response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api/models/x"))
        raise RepositoryNotFoundError("404 Client Error\nRepository Not Found", response=response)

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", missing)
    path = recipe_in(tmp_path, HUB.replace(REPO, "rlvr-test/typo"))
    assert one_error_line(cli("validate", path)) == (
        f"error: {path}:7: model.path: rlvr-test/typo is neither a folder (a relative path starts at the recipe's "
        "folder) nor a hub repo (a private one needs HF_TOKEN)"
    )
    with pytest.raises(RecipeError, match="nor a hub repo"):
        load_recipe(path)


def test_commands_that_only_read_a_recipe_never_fail_on_an_uncached_id(tmp_path: Path, cache: Path) -> None:
    path = recipe_in(tmp_path, HUB.replace(REPO, "rlvr-test/not-cached"))
    assert load_recipe(path, check_files=False).model.path == "rlvr-test/not-cached"
    assert load_recipe(recipe_in(tmp_path), check_files=False).model.path == str(snapshot(cache))


def test_plan_says_why_it_has_no_memory_estimate(tmp_path: Path) -> None:
    """A SLURM model folder that lives on the nodes only: no shapes here, and plan says so."""
    out = tmp_path / "resolved.json"
    result = runner.invoke(app, ["plan", str(ROOT / "recipes" / "math_code_judge.toml"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (
        "Memory per GPU: no estimate (no /models/Qwen2.5-7B-Instruct/config.json on this machine to read the "
        "model's shapes from)"
    ) in result.stdout
