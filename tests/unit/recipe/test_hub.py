"""Hub ids as model paths (`rlvr.recipe.hub`): resolved once, while the recipe loads, to a snapshot
folder of the hub cache, which the resolved recipe then holds for every process.

No network: the cache is built under tmp in huggingface_hub's own layout
(`models--org--name/refs/main` holding a commit, `snapshots/<commit>/` the files), holding a copy
of the quickstart policy; the "online" cases point HF_ENDPOINT at a local server that answers
rlvr's reachability probe, and replace huggingface_hub's download functions. The "no network"
cases point it at a closed port, or at a port that accepts and never answers.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.recipe import hub
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


PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def serve(status: int, headers: dict[str, str] | None = None) -> Iterator[str]:
    """A local "hub" answering every HEAD and GET with `status` (and `headers`): its endpoint."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD

        def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def online(cache: Path, monkeypatch) -> Iterator[str]:
    """HF_HUB_OFFLINE=0 and HF_ENDPOINT at a local server that answers the probe."""
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    for endpoint in serve(200):
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        yield endpoint


def closed_port() -> int:
    """A port nothing listens on: bound, read, closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def silent_endpoint() -> Iterator[str]:
    """A blackhole: the kernel completes the TCP handshake (a backlog), nobody ever answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


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


def test_online_validate_and_plan_fetch_config_json_alone(
    tmp_path: Path, cache: Path, online: str, monkeypatch
) -> None:
    import huggingface_hub

    def no_snapshot(*args, **kwargs):
        raise AssertionError("validate and plan never download the weights")

    calls: list = []
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


def test_launch_downloads_the_snapshot_before_anything_starts(
    tmp_path: Path, cache: Path, online: str, monkeypatch
) -> None:
    import huggingface_hub

    calls: list = []

    def snapshot_download(repo_id, *, revision, cache_dir, ignore_patterns):
        calls.append((repo_id, revision, ignore_patterns))
        return str(add_snapshot(Path(cache_dir), repo_id, "f" * 40, ref=revision))

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


def test_a_hub_error_is_one_line(tmp_path: Path, cache: Path, online: str, monkeypatch) -> None:
    import httpx
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    def missing(*args, **kwargs):
        response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api/models/x"))
        raise RepositoryNotFoundError("404 Client Error\nRepository Not Found", response=response)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", missing)
    path = recipe_in(tmp_path, HUB.replace(REPO, "rlvr-test/typo"))
    assert one_error_line(cli("validate", path)) == (
        f"error: {path}:7: model.path: rlvr-test/typo is neither a folder (a relative path starts at the recipe's "
        "folder) nor a hub repo (a private one needs HF_TOKEN)"
    )
    with pytest.raises(RecipeError, match="nor a hub repo"):
        load_recipe(path)


def validate_without_network(tmp_path: Path, endpoint: str, repo: str = "Qwen/Qwen2.5-0.5B"):
    """`rlvr validate recipes/quickstart.toml --set model.path=REPO` as a real process (so that
    huggingface_hub's logging reaches its stderr), online as far as the environment says (no
    HF_HUB_OFFLINE), with an empty hub cache and the hub at `endpoint`: (process, seconds)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", *PROXIES)}
    env.update(HF_HOME=str(tmp_path / "empty-hf"), HF_HUB_OFFLINE="0", HF_ENDPOINT=endpoint, CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "rlvr.cli", "validate", str(ROOT / "recipes" / "quickstart.toml")]
    start = time.monotonic()
    try:  # without the probe: huggingface_hub's 5 retries, 23 s of sleeps (or 6 x 10 s timeouts)
        proc = subprocess.run(
            [*command, "--set", f"model.path={repo}"], capture_output=True, text=True, timeout=40, cwd=ROOT, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"no answer in {exc.timeout} s: {exc.stderr!r}") from None
    return proc, time.monotonic() - start


def unreachable_line(tmp_path: Path, repo: str = "Qwen/Qwen2.5-0.5B") -> str:
    hf = tmp_path / "empty-hf"
    return (
        f"error: --set model.path: cannot reach the hub for {repo} and the hub cache {hf / 'hub'} does not hold it; "
        f"check the network (or HF_ENDPOINT), or fill the cache where the hub is reachable: HF_HUB_OFFLINE=0 "
        f"HF_HOME={hf} hf download {repo}"
    )


def test_no_network_refused_is_one_line_at_once(tmp_path: Path) -> None:
    """A hub whose port refuses: one probe, one line, no retries."""
    proc, seconds = validate_without_network(tmp_path, f"http://127.0.0.1:{closed_port()}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [unreachable_line(tmp_path)]  # no "Retrying in 1s [Retry 1/5]", no Traceback
    assert proc.stdout == ""
    assert seconds < 8, seconds  # the process's start-up; the probe itself is milliseconds


def test_no_network_blackhole_is_one_line_after_the_probe_timeout(tmp_path: Path) -> None:
    """A hub that accepts and never answers: the probe gives up after PROBE_TIMEOUT_S, not after
    huggingface_hub's six 10 s timeouts and its 23 s of retry sleeps."""
    for endpoint in silent_endpoint():
        proc, seconds = validate_without_network(tmp_path, endpoint)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.splitlines() == [unreachable_line(tmp_path)]
        assert hub.PROBE_TIMEOUT_S <= seconds < hub.PROBE_TIMEOUT_S + 8, seconds


def test_a_hub_that_answers_is_asked(tmp_path: Path) -> None:
    """The probe lets a hub that answers through: huggingface_hub asks the same endpoint
    (HF_ENDPOINT), and its 404 for the repo is rlvr's one line."""
    for endpoint in serve(404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}):
        proc, seconds = validate_without_network(tmp_path, endpoint, "rlvr-test/typo")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "error: --set model.path: rlvr-test/typo is neither a folder (a relative path starts at the recipe's "
        "folder) nor a hub repo (a private one needs HF_TOKEN)"
    ]
    assert seconds < 8, seconds


def test_the_probe(monkeypatch) -> None:
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
    for endpoint in serve(200):
        assert hub.hub_reachable(endpoint)
    for endpoint in serve(401):  # a hub that answers, whatever it says
        assert hub.hub_reachable(endpoint + "/")
    for endpoint in serve(502):  # a proxy that cannot reach the hub
        assert not hub.hub_reachable(endpoint)
    start = time.monotonic()
    assert not hub.hub_reachable(f"http://127.0.0.1:{closed_port()}")
    assert not hub.hub_reachable("not a url")
    assert time.monotonic() - start < 1
    for endpoint in silent_endpoint():
        start = time.monotonic()
        assert not hub.hub_reachable(endpoint, timeout=0.3)
        assert 0.3 <= time.monotonic() - start < 1.5


def test_the_probe_reads_hf_endpoint_now(monkeypatch) -> None:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert hub.hub_endpoint() == "https://huggingface.co"
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.example/")
    assert hub.hub_endpoint() == "https://hf-mirror.example"


def test_without_network_the_cache_answers_as_huggingface_hub_would(tmp_path: Path, cache: Path, monkeypatch) -> None:
    """An unreachable hub is no error where huggingface_hub would fall back to the cache: a
    complete snapshot for launch, a config.json alone for validate; and it is probed once."""
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the probe said the hub does not answer")

    probes: list[str] = []

    def unreachable(endpoint: str, timeout: float = hub.PROBE_TIMEOUT_S) -> bool:
        probes.append(endpoint)
        return False

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    monkeypatch.setattr(hub, "hub_reachable", unreachable)
    for name in ("hf_hub_download", "snapshot_download", "list_repo_files"):
        monkeypatch.setattr(huggingface_hub, name, no_network)
    judge = "rlvr-test/tiny-judge"
    add_snapshot(cache, judge, "d" * 40, files=ROOT / "recipes" / "quickstart" / "judge")
    body = HUB + f'\n[judge]\nmodel = "{judge}"\n'
    recipe, found = load_recipe_with_hub(recipe_in(tmp_path, body), hub="download")
    assert recipe.model.path == str(snapshot(cache))
    assert [s.line() for s in found] == [
        f"model.path: {REPO} @ main -> {snapshot(cache)} (cached)",
        f"judge.model: {judge} @ main -> {snapshot(cache, 'd' * 40, judge)} (cached)",
    ]
    peeked = add_snapshot(cache, "rlvr-test/peeked", "e" * 40, files=None)
    (peeked / "config.json").write_text((POLICY / "config.json").read_text())
    path = recipe_in(tmp_path, HUB.replace(REPO, "rlvr-test/peeked"))
    result = cli("validate", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        f"model.path: rlvr-test/peeked @ main -> {peeked} (only config.json fetched; rlvr launch downloads the rest)"
    )
    assert probes == ["http://hub.invalid"] * 2  # one per recipe load, not one per id


def test_huggingface_hubs_retry_lines_are_quiet_during_a_call(recwarn) -> None:
    import logging
    import warnings

    import huggingface_hub.utils.logging

    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    keep = Keep()
    hub_logger = logging.getLogger("huggingface_hub")
    before = hub_logger.level
    hub_logger.addHandler(keep)
    try:
        with hub.quiet_hub():
            huggingface_hub.utils.logging.get_logger("huggingface_hub.utils._http").warning(
                "Retrying in 1s [Retry 1/5]."
            )
            warnings.warn("a library's warning", UserWarning, stacklevel=1)
        assert said == [] and len(recwarn) == 0
        assert hub_logger.level == before
        hub_logger.warning("after the call")
        assert said == ["after the call"]
    finally:
        hub_logger.removeHandler(keep)


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
