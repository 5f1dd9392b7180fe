"""The run directory: every path inside it, where it is, and the one atomic write.

A run directory (`experiment.output_dir / experiment.name`) is the one thing every process of a
run shares: the launcher writes the resolved recipe there, rollout servers announce themselves
there, trainer rank 0 writes metrics and status there, checkpoints live there, and `rlvr monitor`
reads it from another terminal or a login node. So its layout lives in this one place, and every
writer goes through `write_atomic` (a temporary file beside the target, then `os.replace`), so a
reader or a crash never sees half a file. The layout, file by file: docs/running.md.

Nothing here imports torch or any other part of rlvr: the recipe layer, the CLI and the launchers
all use it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECIPE_FILE = "resolved_recipe.json"
RECIPES_DIR = "recipes"  # launch-<n>.json per launch
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
SAMPLES_FILE = "samples.jsonl"
CHECKPOINTS_DIR = "checkpoints"
SERVERS_DIR = "servers"
JUDGE_FILE = "judge.url"
LOGS_DIR = "logs"
SLURM_DIR = "slurm"
ATTEMPT_FILE = "attempt.json"
TRAINER_EXIT_FILE = "trainer_exit.json"
TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_id"
SBATCH_FILE = "job.sbatch"
LOCK_FILE = ".lock"
GENERATION_FILE = "generation.json"  # the newest trainer start's generation (the fence)
HEARTBEATS_DIR = "heartbeats"  # trainer-rank<r>: rewritten every few seconds by each live trainer rank
LATEST_FILE = "latest"  # in checkpoints/: the name of the newest complete step_N
CHECKPOINT_META = "meta.json"  # written last into a step_N/: its presence means complete
_STEP = re.compile(r"^step_(\d+)$")
_LAUNCH = re.compile(r"^launch-(\d+)\.json$")

DONE_STATES = ("finished", "failed", "stopped")
"""status.json states after which the run's trainer is gone."""

GENERATION_ENV = "RLVR_TRAINER_GENERATION"
"""How a launcher hands a trainer its generation (`RunDir.next_generation`)."""
GENERATION_HEADER = "X-Rlvr-Generation"
"""The HTTP header a trainer's rollout client sends its generation in (the engines fence on it)."""
GENERATION_FILE_ENV = "RLVR_GENERATION_FILE"
"""How a launcher points its rollout servers at the run's generation record: a restarted server
fences from the newest generation at once, not from the first push it sees."""
STALE_STATUS = 409
"""An engine's answer to a trainer older than one it has seen: {"stale_generation": true, "message": ...}."""


class StaleGeneration(BaseException):
    """A trainer of an older generation tried to write into the run or push to an engine: a newer
    trainer owns both now. The message is the one line the stale trainer prints before it stops.

    A BaseException (like SystemExit): the handlers that turn an ordinary failure into a retry, a
    dropped engine or a checkpoint must not catch it; the process stops, writing nothing more."""


def trainer_generation(env: Mapping[str, str] | None = None) -> int | None:
    """This trainer's generation, as its launcher passed it (None: started without one, unfenced)."""
    raw = (os.environ if env is None else env).get(GENERATION_ENV, "")
    return int(raw) if raw.strip().isdigit() else None


def run_dir_of(experiment: Any) -> Path:
    """`output_dir/name` of a recipe's `experiment` table, absolute (nodes may start elsewhere)."""
    return (Path(experiment.output_dir) / experiment.name).resolve()


class _At:
    """A path under the run directory, read as an attribute: `RunDir(r).status` is r/status.json."""

    def __init__(self, *parts: str):
        self.parts = parts

    def __get__(self, paths: Any, owner: type | None = None) -> Path:
        return paths.root.joinpath(*self.parts)


class RunDir:
    """The paths of one run directory; building one touches nothing on disk."""

    __slots__ = ("root",)

    recipe = _At(RECIPE_FILE)
    recipes = _At(RECIPES_DIR)
    status = _At(STATUS_FILE)
    metrics = _At(METRICS_FILE)
    events = _At(EVENTS_FILE)
    samples = _At(SAMPLES_FILE)
    checkpoints = _At(CHECKPOINTS_DIR)
    servers = _At(SERVERS_DIR)
    judge = _At(SERVERS_DIR, JUDGE_FILE)
    logs = _At(LOGS_DIR)
    slurm = _At(SLURM_DIR)
    attempt = _At(SLURM_DIR, ATTEMPT_FILE)
    trainer_exit = _At(SLURM_DIR, TRAINER_EXIT_FILE)
    tensorboard = _At(TENSORBOARD_DIR)
    wandb_id = _At(WANDB_ID_FILE)
    sbatch_script = _At(SBATCH_FILE)
    generation_file = _At(GENERATION_FILE)
    heartbeats = _At(HEARTBEATS_DIR)

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    @classmethod
    def of(cls, recipe: Any) -> RunDir:
        """The run directory a recipe writes to (`experiment.output_dir / experiment.name`)."""
        return cls(run_dir_of(recipe.experiment))

    def server(self, index: int) -> Path:
        """Where rollout server `index` registers its address."""
        return self.servers / f"{index}.json"

    def heartbeat(self, rank: int) -> Path:
        """Trainer rank `rank`'s heartbeat file (`rlvr.process.Heartbeat`; the launcher watches it)."""
        return self.heartbeats / f"trainer-rank{rank}"

    def log(self, name: str) -> Path:
        """The log file of child process `name` (`trainer`, `rollout-0`, `judge`)."""
        return self.logs / f"{name}.log"

    def lock(self) -> RunLock:
        """Take the run directory for one launch, or raise RunActive naming the holder.

        Two launches into one directory overwrite each other's server registrations and
        interleave metrics (steps 1, 2, 1); the second must be refused before it writes
        anything. `flock` is released by the kernel when the holder exits, however it exits,
        so a killed launch never leaves a stale lock behind.
        """
        return RunLock(self.root / LOCK_FILE)

    def finished_at(self, max_steps: int) -> int | None:
        """The step a finished run ended at, if it already reached `max_steps` (else None)."""
        status = read_status(self.root) or {}
        step = int(status.get("step") or 0)
        return step if status.get("state") == "finished" and step >= max_steps else None

    def is_run(self) -> bool:
        """A trainer has written here (what `rlvr monitor` can show)."""
        return self.status.exists() or self.metrics.exists()

    # -- the trainer's generation: one owner of the run at a time

    def generation(self) -> int:
        """The generation of the newest trainer start recorded here (0: none yet)."""
        data = read_json(self.generation_file)
        return int(data.get("generation", 0)) if isinstance(data, dict) else 0

    def next_generation(self) -> int:
        """Record one more trainer start and return its generation (1, 2, ...: never reused, across
        launches and SLURM attempts too). Only the launcher that holds the run calls it, just before
        it starts a trainer; from then on an older generation's writes and pushes are refused."""
        generation = self.generation() + 1
        record = {"generation": generation, "time": time.time(), "by": f"pid {os.getpid()} on {socket.gethostname()}"}
        write_json_atomic(self.generation_file, record, durable=True)
        return generation

    def check_generation(self, generation: int | None, *, doing: str) -> None:
        """Raise StaleGeneration when a trainer newer than `generation` was started here (`doing`:
        what the stale trainer was about to write, for its one line); None is never fenced."""
        if generation is None:
            return
        newest = self.generation()
        if newest > generation:
            raise StaleGeneration(
                f"trainer generation {generation} is stale: generation {newest} owns {self.root} now "
                f"(a newer trainer was started); {doing} refused, this trainer stops"
            )

    def write_recipe(self, text: str) -> Path:
        """Write the resolved recipe the workers read; creates the directory."""
        write_atomic(self.recipe, text)
        return self.recipe

    def keep_last_launch(self) -> tuple[str, Path] | None:
        """The resolved recipe of this run's last launch and the recipes/ file that keeps it, kept
        now if it is not yet (a run from before launches were kept, or one `rlvr sbatch` wrote);
        None where no run has been (`rlvr plan` may write resolved_recipe.json into a new dir)."""
        if not (self.is_run() or self._launches()):
            return None
        try:
            text = self.recipe.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        kept = self.launch_recipes()
        if kept and kept[-1].read_text(encoding="utf-8") == text:
            return text, kept[-1]
        return text, self.keep_launch_recipe(text)

    def launched_at(self) -> float | None:
        """When the last launch began (it kept its recipe then); None before any launch."""
        done = self._launches()
        try:
            return done[-1][1].stat().st_mtime if done else None
        except FileNotFoundError:
            return None

    def launch_recipe(self, n: int) -> Path:
        """The resolved recipe launch `n` (1, 2, ...) of this run used."""
        return self.recipes / f"launch-{n}.json"

    def launch_recipes(self) -> list[Path]:
        """Each launch's resolved recipe, oldest first."""
        return [path for _, path in self._launches()]

    def keep_launch_recipe(self, text: str) -> Path:
        """Keep `text` as the next launch's recipe (resolved_recipe.json is only the current one)."""
        done = self._launches()
        path = self.launch_recipe(done[-1][0] + 1 if done else 1)
        write_atomic(path, text)
        return path

    def _launches(self) -> list[tuple[int, Path]]:
        if not self.recipes.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.recipes.iterdir() if (m := _LAUNCH.match(p.name))]
        return sorted(found)


class RunActive(RuntimeError):
    """Another process holds the run directory's lock; the message names it."""


class RunLock:
    """An exclusive `flock` on RUN/.lock for as long as the launcher runs (a context manager)."""

    def __init__(self, path: Path):
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text(errors="replace").strip() or "another process"
            os.close(self._fd)
            raise RunActive(f"run active ({holder})") from None
        os.ftruncate(self._fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(self._fd, f"pid {os.getpid()} on {socket.gethostname()}, since {started}".encode())

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_status(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's status.json, or None when there is none yet (or it is not JSON)."""
    return read_json(RunDir(run_dir).status)


def write_atomic(path: str | Path, text: str, *, durable: bool = False) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never half.

    The temporary name carries the pid and thread, so two writers never share one. `durable`
    fsyncs the data before the rename (checkpoint markers: the rename must not land on disk
    before the bytes it points to). The parent folder is created if missing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: Any, *, durable: bool = False, indent: int | None = None) -> None:
    """`write_atomic` of `data` as JSON."""
    write_atomic(path, json.dumps(data, indent=indent), durable=durable)


def read_json(path: str | Path) -> Any:
    """The JSON in `path`, or None when the file is missing or not (yet) JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# -- checkpoint folders (torch-free: the CLI resolves `--resume`, `eval` and `export` paths with them)


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step}"


def step_of(path: Path) -> int | None:
    """N of a `step_N` folder name; None for any other name (`step_N.tmp` included)."""
    m = _STEP.match(path.name)
    return int(m.group(1)) if m else None


def is_checkpoint(path: Path) -> bool:
    return (path / CHECKPOINT_META).exists()


def complete_checkpoints(root: str | Path) -> list[Path]:
    """The complete `step_N` folders under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None and is_checkpoint(p)]
    return sorted(found, key=lambda p: step_of(p) or 0)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None.

    Trusts the `latest` pointer when it names a complete folder, else scans `step_N/` folders
    that have meta.json (a pointer lost with a disk or edited by hand still resumes).
    """
    root = Path(root)
    pointer = root / LATEST_FILE
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if is_checkpoint(candidate):
            return candidate
    done = complete_checkpoints(root)
    return done[-1] if done else None


def find_checkpoint(path: Path) -> Path | None:
    """The checkpoint a user means: `RUN/checkpoints/step_N` itself, the `RUN/checkpoints/latest`
    pointer file, `RUN/checkpoints`, or `RUN` (its latest complete one); None if there is none."""
    if path.is_file() and path.name == LATEST_FILE:
        path = path.parent
    for folder in (path, path / CHECKPOINTS_DIR):
        if is_checkpoint(folder):
            return folder
        found = latest_checkpoint(folder)
        if found is not None:
            return found
    return None


def run_of_checkpoint(checkpoint: Path) -> RunDir:
    """The run directory a `RUN/checkpoints/step_N` belongs to (its resolved recipe is there)."""
    return RunDir(checkpoint.resolve().parent.parent)
