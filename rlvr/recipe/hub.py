"""Hugging Face hub ids in a recipe (`model.path`, `model.tokenizer`, `judge.model`) become local
snapshot folders, once, while the recipe loads.

Why here, and only here: every consumer (trainer ranks, the rollout servers, the judge, in-run
eval) reads the resolved recipe that `launch` writes; if it already holds the snapshot folder, they
all load the same files, none talks to the hub, and a SLURM node never downloads on its own. A
folder that exists always wins; only an `org/name` that is no folder is a hub id. How much is
fetched depends on the command (`HubMode`): `download` (launch, sbatch), `peek` (validate, plan:
never the weights) or `cached`. The environment (HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE) is read at
each call, not from huggingface_hub's import-time constants, and huggingface_hub is imported only
when a hub id is met: no torch, no transformers (docs/recipes.md, "Hub ids"). Before the first call
that would go to the hub, one short probe of the endpoint (HF_ENDPOINT) says whether it answers at
all: without a network the answer is one line at once, not huggingface_hub's retries (about 23 s);
its logging and warnings are quiet while rlvr calls it.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

HubMode = Literal["download", "peek", "cached"]
Kind = Literal["model", "tokenizer"]

DEFAULT_REVISION = "main"
COMMIT = re.compile(r"[0-9a-f]{40}")
TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's ENV_VARS_TRUE_VALUES
DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0  # the whole probe: name lookup, connect, TLS, the first response byte

# Never what rlvr loads: other frameworks' weights, exports, and Meta's `original/` checkpoints
# (a second copy of the weights in Llama repos).
OTHER_FORMATS = ["*.gguf", "*.h5", "*.msgpack", "*.onnx", "onnx/*", "*.ot", "*.ckpt", "*.tflite", "original/*"]
TORCH_PICKLES = ["*.bin", "*.pt", "*.pth"]  # skipped when the repo has safetensors (the same weights again)


class HubError(Exception):
    """A hub id that cannot become a local folder: the recipe key it is about and one line."""

    def __init__(self, key: tuple[str, ...], message: str):
        super().__init__(message)
        self.key = key
        self.message = message


@dataclass(frozen=True)
class Snapshot:
    """Where one recipe key's hub id resolved to. `folder` is None when it was not fetched at
    all (a tokenizer repo `validate` does not peek into); `state` says how complete it is."""

    key: str
    repo_id: str
    revision: str
    cache: str
    folder: str | None
    state: Literal["cached", "downloaded", "config.json only", "not fetched"]

    @property
    def complete(self) -> bool:
        return self.state in ("cached", "downloaded")

    @property
    def value(self) -> str:
        """What the recipe holds now: the folder, or the id when nothing was fetched."""
        return self.folder or self.repo_id

    def line(self) -> str:
        """`model.path: org/name @ main -> FOLDER (cached)`: what `validate`, `plan` and `launch` print."""
        where = self.folder or f"(not in {self.cache})"
        why = {
            "config.json only": "only config.json fetched; rlvr launch downloads the rest",
            "not fetched": "rlvr launch downloads it",
        }.get(self.state, self.state)
        return f"{self.key}: {self.repo_id} @ {self.revision} -> {where} ({why})"


PYPI_PREFIX = "pypi:"
"""`model.path = "pypi:smollm2"`: a real model built from a PyPI wheel (rlvr.models)."""


def looks_like_hub_id(value: str) -> bool:
    """`Qwen/Qwen2.5-0.5B`: one slash, no leading dot or slash (what a user copies from the hub)."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", value) is not None


def hub_cache() -> str:
    """The hub cache folder, as huggingface_hub derives it (HF_HUB_CACHE, else HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub), from the environment now."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return os.path.expandvars(os.path.expanduser(cache))


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value, now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in TRUE


def hub_endpoint() -> str:
    """The hub huggingface_hub talks to (HF_ENDPOINT, else huggingface.co), from the environment now."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_reachable(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether `endpoint` answers one HEAD request within `timeout` seconds, through the proxies the
    environment names, as huggingface_hub's client would. Any status is an answer (a 404, a 401)
    but a gateway's 502/503/504: a proxy that cannot reach the hub, or a hub that is down, which
    huggingface_hub would only retry. The request runs in a daemon thread waited on for `timeout`,
    so a name lookup that hangs (which no socket timeout bounds) cannot hold the caller either. The
    certificate is not checked (nothing is read from the answer) and no token is sent."""
    import httpx

    answered: list[bool] = []

    def probe() -> None:
        try:
            with httpx.Client(timeout=timeout, verify=False, follow_redirects=False) as client:
                status = client.head(endpoint + "/").status_code
        except Exception:  # noqa: BLE001 - no route, refused, timed out, no such name, a bad URL: no answer
            status = None
        answered.append(status is not None and status not in (502, 503, 504))

    thread = threading.Thread(target=probe, name="rlvr-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return answered == [True]


@contextmanager
def quiet_hub() -> Iterator[None]:
    """huggingface_hub's logger at ERROR (its `Retrying in 1s [Retry 1/5]` lines are warnings) and
    Python warnings ignored, for the duration of a call; the error that ends it is rlvr's one line."""
    import logging
    import warnings

    import huggingface_hub.utils.logging  # noqa: F401 - configures its logger on import: before the level is set

    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hub_logger.setLevel(level)


def download_command(repo_id: str, revision: str) -> str:
    """The shell line that fills the cache this process reads: the cache variables the
    environment sets (so it fills the same folder from any shell), and HF_HUB_OFFLINE=0, since
    the shell that got the error has it set."""
    env = ["HF_HUB_OFFLINE=0"]
    for name in ("HF_HOME", "HF_HUB_CACHE"):
        if os.environ.get(name):
            env.append(f"{name}={shlex.quote(os.environ[name])}")
    command = f"hf download {shlex.quote(repo_id)}"
    if revision != DEFAULT_REVISION:
        command += f" --revision {shlex.quote(revision)}"
    return " ".join([*env, command])


def cached_folder(repo_id: str, revision: str, cache: str, *, repo_type: str = "model") -> Path | None:
    """The snapshot folder of `repo_id` at `revision` in the cache, as huggingface_hub lays it out
    (`models--org--name/refs/<branch or tag>` holds the commit, `snapshots/<commit>/` the files;
    `datasets--...` for `repo_type = "dataset"`), or None when the cache has no such folder. Says
    nothing about which files are in it."""
    storage = Path(cache) / (f"{repo_type}s--" + repo_id.replace("/", "--"))
    commit = revision if COMMIT.fullmatch(revision) else None
    if commit is None:
        try:
            commit = (storage / "refs" / revision).read_text().strip()
        except OSError:
            return None
    folder = storage / "snapshots" / commit
    return folder if commit and folder.is_dir() else None


def is_complete(folder: Path, kind: Kind) -> bool:
    """A model snapshot has config.json and every weight file its index lists; a tokenizer
    snapshot has tokenizer files. (A `peek` leaves a snapshot folder with config.json alone.)"""
    from rlvr.recipe.model_folder import weights_problem
    from rlvr.recipe.tokenizer import has_tokenizer_files

    if kind == "tokenizer":
        return has_tokenizer_files(str(folder))
    return (folder / "config.json").is_file() and weights_problem(folder) is None


def node_local_cache(cache: str) -> str | None:
    """The node-local root (`rlvr.recipe.plan.NODE_LOCAL`) the cache lies under, if any."""
    from rlvr.recipe.plan import node_local_root

    return node_local_root(cache) or node_local_root(str(Path(cache).resolve()))


class HubIds:
    """Resolves the hub ids of one recipe load; an id named twice (policy and judge, or path and
    tokenizer) is resolved once. `snapshots` lists what each key became, in order."""

    def __init__(self, mode: HubMode, *, slurm: bool = False, announce: Callable[[str], None] | None = None):
        self.mode: HubMode = mode
        self.slurm = slurm
        self.announce = announce or (lambda line: None)
        self.snapshots: list[Snapshot] = []
        self._seen: dict[tuple[str, str, Kind], Snapshot] = {}
        self._reachable: dict[str, bool] = {}  # endpoint -> whether it answered: one probe per load

    def _hub_answers(self) -> bool:
        endpoint = hub_endpoint()
        if endpoint not in self._reachable:
            self._reachable[endpoint] = hub_reachable(endpoint)
        return self._reachable[endpoint]

    def resolve(self, repo_id: str, *, key: tuple[str, ...], revision: str | None, kind: Kind) -> Snapshot | None:
        """The snapshot `repo_id` resolves to (None in `cached` mode when the cache lacks it).
        Raises `HubError` with the one line a user sees."""
        if repo_id.startswith(PYPI_PREFIX):
            return self._pypi(repo_id, key=key)
        revision = revision or DEFAULT_REVISION
        seen = self._seen.get((repo_id, revision, "model")) or self._seen.get((repo_id, revision, kind))
        found = seen or self._fetch(repo_id, revision=revision, key=key, kind=kind)
        if found is None:
            return None
        self._seen[(repo_id, revision, kind)] = found
        snapshot = Snapshot(".".join(key), repo_id, revision, found.cache, found.folder, found.state)
        self.snapshots.append(snapshot)
        return snapshot

    def _pypi(self, value: str, *, key: tuple[str, ...]) -> Snapshot | None:
        """`pypi:smollm2`: a model rlvr builds from a PyPI wheel (`rlvr models get`), the same way
        as a hub id: `launch` builds it once into the models cache, `validate`/`plan` only look."""
        from rlvr.models.pypi import ModelBuildError, cache_root, ensure_model, is_built, lookup, model_dir

        name = value.removeprefix(PYPI_PREFIX)
        label = ".".join(key)
        try:
            spec = lookup(name)
        except ModelBuildError as exc:
            raise HubError(key, str(exc).replace("unknown model", f"unknown {PYPI_PREFIX} model")) from None
        cache, folder = str(cache_root()), str(model_dir(name))
        if is_built(name):
            found = Snapshot(label, value, spec.requirement, cache, folder, "cached")
        elif self.mode == "cached":
            return None
        elif self.mode == "peek":
            found = Snapshot(label, value, spec.requirement, cache, None, "not fetched")
        else:
            self.announce(f"building {value} from {spec.requirement} into {folder} (once, before anything starts)")
            try:
                ensure_model(name)
            except ModelBuildError as exc:
                raise HubError(key, f"{value}: {exc}; or build it where PyPI answers: rlvr models get {name}") from None
            found = Snapshot(label, value, spec.requirement, cache, folder, "downloaded")
        self.snapshots.append(found)
        return found

    def _fetch(self, repo_id: str, *, revision: str, key: tuple[str, ...], kind: Kind) -> Snapshot | None:
        cache = hub_cache()
        label = ".".join(key)
        if self.mode != "cached" and self.slurm and (root := node_local_cache(cache)):
            var = "HF_HUB_CACHE" if os.environ.get("HF_HUB_CACHE") else "HF_HOME"
            raise HubError(
                key,
                f"hub id {repo_id} would be read from the hub cache {cache}, which is node-local ({root}): the "
                f"SLURM nodes cannot see it; set {var} to a folder every node sees (export {var}=/shared/huggingface)",
            )
        folder = cached_folder(repo_id, revision, cache)
        cached = folder is not None and is_complete(folder, kind)
        if self.mode == "cached" or (cached and (self.mode == "peek" or hub_offline())):
            if not cached:
                return None
            return Snapshot(label, repo_id, revision, cache, str(folder), "cached")
        if hub_offline():
            at = f" at revision {revision}" if revision != DEFAULT_REVISION else ""
            fill = f"fill the cache with: {download_command(repo_id, revision)}"
            if folder is not None:  # e.g. config.json alone, from an online `validate`
                missing = "tokenizer" if kind == "tokenizer" else "weights"
                raise HubError(
                    key,
                    f"the hub cache {cache} holds {repo_id}{at} without its {missing} ({folder}), and "
                    f"HF_HUB_OFFLINE=1 forbids downloading them; {fill}",
                )
            raise HubError(
                key,
                f"{repo_id} is neither a folder (a relative path starts at the recipe's folder) nor in the hub cache "
                f"{cache}{at}, and HF_HUB_OFFLINE=1 forbids downloading it; {fill}",
            )
        if self.mode == "peek" and kind == "tokenizer":  # no config.json to peek at; launch fetches the tokenizer
            return Snapshot(label, repo_id, revision, cache, None, "not fetched")
        if not self._hub_answers():  # what huggingface_hub falls back to after its retries, at once
            if cached and folder is not None:
                return Snapshot(label, repo_id, revision, cache, str(folder), "cached")
            if self.mode == "peek" and folder is not None and (folder / "config.json").is_file():
                return Snapshot(label, repo_id, revision, cache, str(folder), "config.json only")
            raise HubError(key, unreachable(repo_id, revision, cache))
        try:
            with quiet_hub():
                if self.mode == "peek":
                    return self._config_only(repo_id, revision=revision, cache=cache, label=label)
                if not cached:
                    self.announce(f"downloading {repo_id} @ {revision} into {cache} (once, before anything starts)")
                fetched = self._download(
                    repo_id, revision=revision, cache=cache, kind=kind, local=folder if cached else None
                )
        except Exception as exc:  # noqa: BLE001 - the hub's errors, the network's, the disk's: one line each
            raise HubError(*hub_problem(exc, repo_id=repo_id, revision=revision, key=key, cache=cache)) from None
        state = "cached" if cached and folder is not None and Path(fetched) == folder else "downloaded"
        return Snapshot(label, repo_id, revision, cache, fetched, state)

    def _config_only(self, repo_id: str, *, revision: str, cache: str, label: str) -> Snapshot:
        """config.json alone (a few KB), into the snapshot folder `launch` later completes."""
        from huggingface_hub import hf_hub_download

        config = hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache)
        return Snapshot(label, repo_id, revision, cache, str(Path(config).parent), "config.json only")

    def _download(self, repo_id: str, *, revision: str, cache: str, kind: Kind, local: Path | None) -> str:
        """The snapshot, without the files rlvr never loads (other formats; for a tokenizer, any
        weights). A complete cached snapshot still goes through snapshot_download: the hub says
        whether the revision moved (and huggingface_hub falls back to the cache when it cannot be
        reached); which weight format to skip is then read from the cached files, not the hub."""
        from huggingface_hub import list_repo_files, snapshot_download

        ignore = list(OTHER_FORMATS)
        if kind == "tokenizer":
            ignore += ["*.safetensors", *TORCH_PICKLES]
        else:
            names = (
                [p.name for p in local.iterdir()] if local is not None else list_repo_files(repo_id, revision=revision)
            )
            if any(name.endswith(".safetensors") for name in names):
                ignore += TORCH_PICKLES
        return snapshot_download(repo_id, revision=revision, cache_dir=cache, ignore_patterns=ignore)


def hub_problem(
    exc: Exception, *, repo_id: str, revision: str, key: tuple[str, ...], cache: str
) -> tuple[tuple[str, ...], str]:
    """(recipe key, one line) for an error of huggingface_hub or the network."""
    import httpx
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        return (
            key,
            f"{repo_id} is gated: accept its terms on huggingface.co, then set HF_TOKEN to a token of that account",
        )
    if isinstance(exc, RepositoryNotFoundError):
        return key, (
            f"{repo_id} is neither a folder (a relative path starts at the recipe's folder) nor a hub repo "
            "(a private one needs HF_TOKEN)"
        )
    if isinstance(exc, RevisionNotFoundError):
        where = ("model", "revision") if key == ("model", "path") else key  # only model.path takes a revision
        return where, f"{repo_id} has no revision {revision!r} on the hub (a branch, tag or commit)"
    if isinstance(exc, RemoteEntryNotFoundError):
        return key, f"{repo_id} has no config.json at revision {revision}: not a transformers model repo"
    if isinstance(exc, HFValidationError):
        return key, f"{repo_id!r} is neither a folder nor a valid hub id: {str(exc).splitlines()[0]}"
    if isinstance(exc, (LocalEntryNotFoundError, httpx.TransportError)):
        return key, unreachable(repo_id, revision, cache)
    first = (str(exc).strip().splitlines() or [""])[0]
    return key, f"fetching {repo_id} @ {revision} into {cache} failed: {type(exc).__name__}: {first}"


def unreachable(repo_id: str, revision: str, cache: str) -> str:
    """The one line for a hub that does not answer and a cache without the id."""
    return (
        f"cannot reach the hub for {repo_id} and the hub cache {cache} does not hold it; check the network "
        f"(or HF_ENDPOINT), or fill the cache where the hub is reachable: {download_command(repo_id, revision)}"
    )


def pending_values(snapshots: list[Snapshot]) -> frozenset[str]:
    """The recipe values (folders, or ids) that `launch` has yet to download: the start-up checks
    leave their weights and tokenizer to it."""
    return frozenset(s.value for s in snapshots if not s.complete)


def report_lines(snapshots: list[Snapshot], *, slurm: bool) -> list[str]:
    """What `validate`, `plan` and `launch` print: a line per resolved key, and on SLURM the cache
    the nodes read the snapshots from."""
    lines = [s.line() for s in snapshots]
    if slurm and snapshots:
        caches = ", ".join(sorted({s.cache for s in snapshots}))
        lines.append(f"hub cache: {caches} (the SLURM nodes read the snapshots there; HF_HOME moves it)")
    return lines
