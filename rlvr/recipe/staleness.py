"""What asynchronous rollout asks of the learning rate: a warning line for `rlvr validate` / `plan`.

With `rollout.max_staleness = k` a step trains on samples of weights up to k updates old. The
loss corrects for them (decoupled PPO: the importance weight min(pi_old / pi_rollout, tis_cap),
`rlvr.algorithms.losses`; tests/unit/algorithms/test_off_policy.py checks it is unbiased), but
the samples, and so the direction of the step, are still the old weights': near an lr's
stability limit the asynchronous loop can stall where the synchronous one learns.

Measured (bench/async_lr.py, the quickstart's 0.75M-parameter policy, 20 steps, mean reward
over steps 1-5 -> 16-20; the synchronous loop's own lr is 2e-4):

    lr 2e-4, seed 0: k = 0  0.339 -> 0.481   k = 1  0.334 -> 0.334   k = 2  0.323 -> 0.362 (entropy 0.12 -> 0.21)
    lr 2e-4, seed 1: k = 0  0.369 -> 0.431   k = 1  0.338 -> 0.434
    lr 2e-4, seed 2: k = 0  0.342 -> 0.477   k = 1  0.330 -> 0.436
    lr 1e-4, seed 0: k = 0  0.338 -> 0.453   k = 1  0.328 -> 0.472   k = 2  0.316 -> 0.464

so at the synchronous lr one seed of three stalled at k = 1 (k = 1 gained 0.60x what k = 0 did,
over the three), while at half of it k = 1 and 2 learned like k = 0 (which loses little there).
Trying the correction at the sequence level (the product of the token ratios, so the prefixes
the old weights visited are corrected too) did not rescue the stalled seed (k = 1: 0.334 ->
0.344): it is the staleness, not the correction. It matches a delayed gradient's stability
limit: gradient descent with a k-step delay on a quadratic of curvature h is stable for
lr * h < 2 sin(pi / (4k + 2)), against lr * h < 2 without delay (0.5x at k = 1); beyond the
measured k the limit is scaled by that factor.

LLM-sized recipes train at 1e-7..1e-5, far below these, so the warning fires on tiny models at
the quickstart's rates only; the numbers are this model's, the rule (about half an lr tuned
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
        f"learns (the quickstart at its lr 2e-4: k = 1 stalled on one seed of three, k = 2 too; at 1e-4 both "
        f"learned like k = 0); "
        f"lower trainer.lr (to about {limit:.2g} here, or about half an lr tuned synchronously) or set "
        f"rollout.max_staleness = 0"
    ]
