"""What asynchronous rollout asks of the learning rate: a warning line for `rlvr validate` / `plan`.

With `rollout.max_staleness = k` a step trains on samples of weights up to k updates old. The loss
corrects for them (decoupled PPO's truncated importance weight, `rlvr.algorithms.losses`), but the
samples, and so the step's direction, are still the old weights': near an lr's stability limit the
asynchronous loop can stall where the synchronous one learns. Measured on the quickstart
(bench/async_lr.py, docs/async.md: "What staleness costs in learning"), k = 1 stalled on one seed
of three at the synchronous lr and learned like k = 0 at half of it, as a delayed gradient's
stability limit predicts (sin(pi / (4k + 2)) of the undelayed one; beyond the measured k the limit
is scaled by that factor). The numbers are that tiny model's; the rule (about half an lr tuned
synchronously near its limit) is what carries over.
"""

from __future__ import annotations

import math

from rlvr.recipe.schema import Recipe

# max_staleness -> the largest trainer.lr measured to learn like k = 0 on the quickstart (2e-4 did not).
MEASURED_LR: dict[int, float] = {1: 1e-4, 2: 1e-4}


def delayed_step_factor(max_staleness: int) -> float:
    """sin(pi / (4k + 2)): the largest stable step with a k-step-old gradient, relative to k = 0."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return math.sin(math.pi / (4 * max_staleness + 2))


def max_measured_lr(max_staleness: int) -> float:
    """The lr up to which `max_staleness` learned like the synchronous loop (inf at k = 0); past
    the measured k, the last measured value scaled by the delayed-gradient factor."""
    if max_staleness == 0:
        return math.inf
    if max_staleness in MEASURED_LR:
        return MEASURED_LR[max_staleness]
    known = max(MEASURED_LR)
    return MEASURED_LR[known] * delayed_step_factor(max_staleness) / delayed_step_factor(known)


def staleness_warnings(recipe: Recipe) -> list[str]:
    """One line when `rollout.max_staleness` > 0 and `trainer.lr` is above what that staleness
    learned at; empty otherwise. For `rlvr validate` / `rlvr plan` to print as a warning."""
    k, lr = recipe.rollout.max_staleness, recipe.trainer.lr
    limit = max_measured_lr(k)
    if k == 0 or lr <= limit:
        return []
    return [
        f"rollout.max_staleness = {k} with trainer.lr = {lr:g}: each step trains on samples of weights up to {k} "
        f"update(s) old, and near an lr's stability limit that can stall learning where the synchronous loop "
        f"learns; lower trainer.lr (to about {limit:.2g} here, or about half an lr tuned synchronously) or set "
        f'rollout.max_staleness = 0 (docs/async.md, "What staleness costs in learning")'
    ]
