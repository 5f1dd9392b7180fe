"""What this machine offers a run, read without torch: the NVIDIA GPUs this process may use
(`visible_gpus`) and the CPU cores it was granted (`cpu_cores`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, without importing torch (CUDA_VISIBLE_DEVICES, else /dev)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [part for part in visible.split(",") if part.strip()]
        return 0 if not ids or ids[0].strip() == "-1" else len(ids)
    return sum(1 for dev in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", dev.name))


def cpu_cores() -> int:
    """The cores this process may run on: its CPU affinity (what SLURM, a cgroup cpuset or
    `taskset` granted), not `os.cpu_count()`, which counts every core of the node."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this platform
        return max(1, os.cpu_count() or 1)
