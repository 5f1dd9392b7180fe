"""Weight sync: trainer weights -> rollout engines after each step (see `rlvr.sync.base`)."""

from rlvr.sync.base import EngineFailure, SyncError, WeightSync, plan_buckets, weight_specs
from rlvr.sync.factory import make_weight_sync, resolve_method

__all__ = [
    "EngineFailure",
    "SyncError",
    "WeightSync",
    "make_weight_sync",
    "plan_buckets",
    "resolve_method",
    "weight_specs",
]
