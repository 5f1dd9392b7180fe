"""Where scalars go besides metrics.jsonl: TensorBoard (default) and W&B (optional)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class TensorBoardSink:
    """Scalars under `run_dir/tensorboard`, named as in metrics.jsonl (`reward/math`, ...)."""

    def __init__(self, run_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        from rlvr.rundir import RunDir

        self.writer = SummaryWriter(log_dir=str(RunDir(run_dir).tensorboard))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Weights & Biases, when `monitor.wandb = true` and the package is installed.

    One run directory is one W&B run: the first start draws a run id and keeps it in
    RUN/wandb_id; every later start (a resume, a requeued SLURM job) passes that id with
    `resume="allow"`, so the curves continue in the same W&B run instead of a new one each time.
    """

    def __init__(self, *, project: str | None, name: str, config: dict[str, Any], run_dir: str | Path):
        try:
            import wandb  # pyright: ignore[reportMissingImports]
        except ImportError as exc:
            raise RuntimeError("monitor.wandb = true needs `pip install wandb`") from exc
        run_id = wandb_run_id(run_dir)
        self.run = wandb.init(project=project, name=name, config=config, dir=str(run_dir), id=run_id, resume="allow")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def wandb_run_id(run_dir: str | Path) -> str:
    """The W&B run id of this run directory, drawn and kept on its first start."""
    import secrets
    import string

    from rlvr.rundir import RunDir, write_atomic

    path = RunDir(run_dir).wandb_id
    try:
        kept = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept
    alphabet = string.ascii_lowercase + string.digits  # what wandb's own ids are made of
    run_id = "".join(secrets.choice(alphabet) for _ in range(8))
    write_atomic(path, run_id + "\n")
    return run_id


def make_sinks(monitor_cfg: Any, *, run_dir: str | Path, name: str, config: dict[str, Any]) -> list[Any]:
    sinks: list[Any] = []
    if monitor_cfg.tensorboard:
        sinks.append(TensorBoardSink(run_dir))
    if monitor_cfg.wandb:
        sinks.append(WandbSink(project=monitor_cfg.wandb_project, name=name, config=config, run_dir=run_dir))
    return sinks
