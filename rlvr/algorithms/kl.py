"""Per-token KL estimators against the reference policy, and KL coefficient controllers.

The estimators follow J. Schulman, "Approximating KL Divergence" (2020), with
log r = logprobs - ref_logprobs for tokens sampled from the current policy: ``k1`` = log r,
``k2`` = 0.5 * (log r)^2, ``k3`` = exp(-log r) + log r - 1 (GRPO's "low_var_kl") and
``abs`` = |log r|; their bias, variance and sign are tabled in docs/algorithms.md.

The controllers decide the coefficient: fixed, or adaptive (Ziegler et al. 2019,
"Fine-Tuning Language Models from Human Preferences", sec. 2.2), which nudges beta so the
measured KL tracks a target.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch
from torch import Tensor

from rlvr.recipe.schema import AlgorithmConfig

KLEstimator = Literal["k1", "k2", "k3", "abs"]

# exp() of a log-ratio above this overflows float32 long before it means anything; the k3 value
# is then clamped like verl does so one wild token cannot dominate a batch.
_LOG_RATIO_CLAMP = 20.0
_K3_MAX = 10.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, *, estimator: str) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate, same shape as the inputs ([B, T]).

    Gradients flow through ``logprobs`` only in the sense the caller wants: pass detached
    tensors for a reward penalty (``kl_in = "reward"``), live ones for a loss term.
    Padding positions are not masked here; multiply by the mask or aggregate with it.
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        neg = (-log_ratio).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        # expm1, not exp() - 1: near the reference policy (|log r| ~ 1e-6, the usual case) exp() - 1
        # cancels to rounding noise and came out negative (-6e-8 at log r = -1e-6). k3 >= 0 exactly,
        # so the floor only removes the last ulp of rounding.
        return (torch.expm1(neg) - neg).clamp(0.0, _K3_MAX)
    if estimator == "abs":
        return log_ratio.abs()
    raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2, k3 or abs")


class KLController(Protocol):
    """What the loop needs from a controller: the current coefficient and a way to update it."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...

    def state_dict(self) -> dict[str, float]: ...

    def load_state_dict(self, state: dict[str, float]) -> None: ...


class FixedKLController:
    """A constant coefficient; ``update`` is a no-op so the loop can call it unconditionally."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        del current_kl, n_steps

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Ziegler et al. 2019, eq. (2): beta <- beta * (1 + clip(KL/target - 1, -0.2, 0.2) * n / horizon).

    ``n_steps`` is the number of samples (sequences) the measured KL was taken over, so the
    coefficient moves by at most 20% per ``horizon`` samples whatever the batch size.
    """

    def __init__(self, init_kl_coef: float, *, target: float, horizon: int):
        if target <= 0:
            raise ValueError(f"adaptive KL target must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"adaptive KL horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = int(state.get("horizon", self.horizon))


def make_kl_controller(cfg: AlgorithmConfig) -> FixedKLController | AdaptiveKLController:
    """The controller an ``AlgorithmConfig`` asks for, starting at ``cfg.kl_coef``."""
    coef = float(cfg.kl_coef)
    if cfg.kl_controller == "adaptive":
        return AdaptiveKLController(coef, target=float(cfg.kl_target), horizon=int(cfg.kl_horizon))
    return FixedKLController(coef)
