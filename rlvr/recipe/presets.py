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
    "mismatch_mask": "none",
    "mismatch_low": None,
    "mismatch_high": None,
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
    "min_group_mean": None,
    "max_group_mean": None,
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
    # Schulman et al. 2017 / Ouyang et al. 2022 (InstructGPT): GAE(gamma=1, lam=0.95) with a critic,
    # whitened advantages, per-token k1 KL to the reference in the reward with beta = 0.02 (InstructGPT).
    "ppo": {
        "advantage": "gae",
        "adv_std_norm": "none",
        "adv_whiten": True,
        "gamma": 1.0,
        "lam": 0.95,
        "critic": True,
        "kl_in": "reward",
        "kl_estimator": "k1",
        "kl_coef": 0.02,
    },
    # Shao et al. 2024 (DeepSeekMath, eq. 3): group mean/std advantages, k3 KL in the loss with
    # beta = 0.04, per-sequence mean of per-token losses (1/G sum_i 1/|o_i| sum_t), clip 0.2.
    "grpo": {"kl_in": "loss", "kl_estimator": "k3", "kl_coef": 0.04, "loss_agg": "seq-mean-token-mean"},
    # Liu et al. 2025 (Understanding R1-Zero-like training): no std, no length normalisation
    # (token sums divided by the constant generation budget), no KL.
    "dr_grpo": {"advantage": "dr_grpo", "adv_std_norm": "none", "loss_agg": "seq-mean-token-sum-norm"},
    # Zheng et al. 2025 (Group Sequence Policy Optimization): length-normalised sequence ratios,
    # clip range 3e-4 / 4e-4 (sec. 5.1), group-normalised advantages, sequence-level mean, no KL.
    "gspo": {
        "policy_loss": "gspo",
        "importance_level": "sequence",
        "clip_ratio_low": 3e-4,
        "clip_ratio_high": 4e-4,
        "loss_agg": "seq-mean-token-mean",
    },
    # Yu et al. 2025 (DAPO): clip-higher (0.2 / 0.28), dynamic sampling, token-level loss, soft overlong
    # punishment, no KL. The paper's buffer is 4096 of 20480 tokens; 64 suits max_new_tokens ~512 here:
    # scale it with rollout.max_new_tokens (about a fifth of it).
    "dapo": {
        "clip_ratio_high": 0.28,
        "dynamic_sampling": True,
        "max_refill_rounds": 3,
        "loss_agg": "token-mean",
        "overlong_buffer": 64,
        "overlong_penalty": 1.0,
    },
    # Hu et al. 2025 (REINFORCE++): token-level k1 KL in the reward (r_t = 1[EOS] r - beta log(pi/pi_ref)),
    # return-to-go, global batch normalisation of advantages, PPO clip.
    "reinforce++": {
        "advantage": "reinforce_pp",
        "adv_std_norm": "batch",
        "kl_in": "reward",
        "kl_estimator": "k1",
        "kl_coef": 0.001,
    },
    # Hu et al. 2025 (REINFORCE++-baseline): subtract the group mean, then normalise over the batch;
    # k2 KL as a loss term (its gradient equals k1-in-the-reward's).
    "reinforce++_baseline": {
        "advantage": "reinforce_pp_baseline",
        "adv_std_norm": "batch",
        "kl_in": "loss",
        "kl_estimator": "k2",
        "kl_coef": 0.001,
    },
    # Ahmadian et al. 2024 (Back to Basics): leave-one-out baseline, plain REINFORCE on the whole
    # sequence's log-prob (the completion is one action: token sums, mean over sequences). The paper's
    # sequence-level KL-in-reward is for learned reward models; off here as in RLVR practice.
    "rloo": {"advantage": "rloo", "adv_std_norm": "none", "policy_loss": "vanilla", "loss_agg": "seq-mean-token-sum"},
    # Le Roux et al. 2025 (Tapered Off-Policy REINFORCE): no ratio on positives, ratio truncated to [0, 1]
    # on negatives, on the sequence log-prob (token sums), raw rewards, no KL. Negatives are those with
    # reward < 0: use signed rewards (e.g. +-1), or set advantage = "dr_grpo" for a group-mean baseline.
    "topr": {"advantage": "reinforce", "adv_std_norm": "none", "policy_loss": "topr", "loss_agg": "seq-mean-token-sum"},
    # Xiong et al. 2025 (A Minimalist Approach to LLM Reasoning): RAFT + importance sampling and PPO clip,
    # trained on positive samples only (advantage 1; the trainer drops the rest from the loss mask),
    # per-sequence mean of token losses.
    "raft++": {"advantage": "raft", "adv_std_norm": "none", "raft_threshold": 0.5, "loss_agg": "seq-mean-token-mean"},
    # MiniMax-M1 (Chen et al. 2025, eq. 4-5): clipped, stop-gradient IS weight times log-prob; every token
    # keeps a gradient; no lower bound on the weight (eps_low = 1); token-level mean; group-normalised
    # advantages; no KL. The paper tunes eps_high without publishing it: 0.28 (DAPO's, Trinity-RFT's default).
    "cispo": {"policy_loss": "cispo", "clip_ratio_low": 1.0, "clip_ratio_high": 0.28, "loss_agg": "token-mean"},
    # Liu et al. 2025 (Tricks or Traps, Lite PPO): PPO clip loss, critic-free, group-level mean and
    # batch-level std of the rewards, token-level aggregation, no KL.
    "lite_ppo": {"adv_std_norm": "batch", "loss_agg": "token-mean"},
    # Williams 1992: plain policy gradient (-A log pi) with a group-mean baseline; no paper preset.
    "vanilla_pg": {"policy_loss": "vanilla", "adv_std_norm": "none"},
}


def resolve_algorithm(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Every knob's value: the base, then the preset, then what the recipe set (non-None)."""
    resolved = dict(BASE)
    resolved.update(PRESETS.get(preset, {}))
    resolved.update({k: v for k, v in overrides.items() if v is not None})
    return resolved
