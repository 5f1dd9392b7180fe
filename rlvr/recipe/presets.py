"""Named algorithm presets: each is a paper's choice of every knob in `[algorithm]`.

A recipe says `preset = "dapo"` and may override any knob; `rlvr plan` prints what the
preset expanded to so nobody has to guess. Presets live beside the schema (pure data,
no torch) because validation needs them; `rlvr.algorithms` implements the knobs.
"""

from __future__ import annotations

from typing import Any

# The values every preset starts from; a preset lists only what it changes.
BASE: dict[str, Any] = {
    "advantage": "grpo",
    "adv_std_norm": "group",
    "adv_whiten": False,
    "adv_clip": 0.0,
    "gamma": 1.0,
    "lam": 1.0,
    "policy_loss": "ppo_clip",
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.2,
    "dual_clip_c": 0.0,
    "importance_level": "token",
    "tis_cap": 0.0,
    "kl_estimator": "k3",
    "kl_coef": 0.0,
    "kl_in": "none",
    "kl_controller": "fixed",
    "kl_target": 0.1,
    "kl_horizon": 10000,
    "entropy_coef": 0.0,
    "loss_agg": "token-mean",
    "dynamic_sampling": False,
    "max_refill_rounds": 0,
    "min_group_std": 0.0,
    "overlong_mask": False,
    "overlong_buffer": 0,
    "overlong_penalty": 1.0,
    "raft_threshold": 0.0,
    "ppo_epochs": 1,
    "mini_batches": 1,
    "critic": False,
    "value_clip": 0.2,
    "critic_lr": 1e-5,
}

PRESETS: dict[str, dict[str, Any]] = {
    # Schulman et al. 2017 / Ouyang et al. 2022: GAE with a critic, KL to the reference in the reward.
    "ppo": {
        "advantage": "gae",
        "adv_std_norm": "none",
        "adv_whiten": True,
        "gamma": 1.0,
        "lam": 0.95,
        "critic": True,
        "kl_in": "reward",
        "kl_estimator": "k1",
        "kl_coef": 0.001,
    },
    # Shao et al. 2024 (DeepSeekMath): group mean/std advantages, k3 KL in the loss.
    "grpo": {"kl_in": "loss", "kl_estimator": "k3", "kl_coef": 0.001, "loss_agg": "seq-mean-token-mean"},
    # Liu et al. 2025 (Understanding R1-Zero-like training): no std, no length normalisation.
    "dr_grpo": {"advantage": "dr_grpo", "adv_std_norm": "none", "loss_agg": "seq-mean-token-sum-norm"},
    # Zheng et al. 2025 (Group Sequence Policy Optimization): sequence-level ratios, tiny clip range.
    "gspo": {
        "policy_loss": "gspo",
        "importance_level": "sequence",
        "clip_ratio_low": 3e-4,
        "clip_ratio_high": 4e-4,
        "loss_agg": "seq-mean-token-mean",
    },
    # Yu et al. 2025 (DAPO): clip-higher, dynamic sampling, token-level loss, soft overlong punishment.
    "dapo": {
        "clip_ratio_high": 0.28,
        "dynamic_sampling": True,
        "max_refill_rounds": 3,
        "loss_agg": "token-mean",
        "overlong_buffer": 64,
        "overlong_penalty": 1.0,
    },
    # Hu et al. 2025 (REINFORCE++): token-level KL in the reward, batch-normalised returns.
    "reinforce++": {
        "advantage": "reinforce_pp",
        "adv_std_norm": "batch",
        "kl_in": "reward",
        "kl_estimator": "k2",
        "kl_coef": 0.001,
    },
    # REINFORCE++-baseline: subtract the group mean, then normalise over the batch.
    "reinforce++_baseline": {
        "advantage": "reinforce_pp_baseline",
        "adv_std_norm": "batch",
        "kl_in": "loss",
        "kl_estimator": "k2",
        "kl_coef": 0.001,
    },
    # Ahmadian et al. 2024 (Back to Basics): leave-one-out baseline.
    "rloo": {"advantage": "rloo", "adv_std_norm": "none"},
    # Roux et al. 2025 (Tapered Off-Policy REINFORCE): truncated ratios on negatives, none on positives.
    "topr": {"advantage": "reinforce", "adv_std_norm": "none", "policy_loss": "topr"},
    # Xiong et al. 2025 (A Minimalist Approach to LLM Reasoning): PPO clip on positive samples only.
    "raft++": {"advantage": "raft", "adv_std_norm": "none", "raft_threshold": 0.5},
    # MiniMax-M1 2025: clipped, stop-gradient IS weight times log-prob; every token keeps a gradient.
    "cispo": {"policy_loss": "cispo", "clip_ratio_low": 1.0, "clip_ratio_high": 0.28, "loss_agg": "token-mean"},
    # Liu et al. 2025 (Tricks or Traps, Lite PPO): group mean, batch std, token-level aggregation.
    "lite_ppo": {"adv_std_norm": "batch", "loss_agg": "token-mean"},
    # Williams 1992: plain policy gradient with a group-mean baseline.
    "vanilla_pg": {"policy_loss": "vanilla", "adv_std_norm": "none"},
}


def resolve_algorithm(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Every knob's value: the base, then the preset, then what the recipe set (non-None)."""
    resolved = dict(BASE)
    resolved.update(PRESETS.get(preset, {}))
    resolved.update({k: v for k, v in overrides.items() if v is not None})
    return resolved
