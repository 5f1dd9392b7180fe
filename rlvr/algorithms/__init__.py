"""The algorithm zoo: pure tensor functions the trainer and the loop call.

- ``advantages``: ``compute_advantages`` (gae, grpo, dr_grpo, rloo, reinforce, reinforce_pp,
  reinforce_pp_baseline, opo, raft), ``RunningMoments``, group normalisation helpers.
- ``losses``: ``aggregate_loss`` (global denominators), ``compute_policy_loss`` (ppo_clip, gspo,
  cispo, topr, vanilla, tis; KL-in-loss, entropy, rollout TIS correction), ``compute_value_loss``.
- ``kl``: ``kl_penalty`` (k1, k2, k3, abs), fixed and adaptive KL controllers.
- ``filters``: ``keep_group``, ``overlong_mask``, ``soft_overlong_penalty``.

Nothing is imported here, so ``import rlvr.algorithms`` stays torch-free (``filters`` is too).
"""
