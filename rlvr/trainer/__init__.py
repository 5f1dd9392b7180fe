"""The trainer: FSDP2 actor (+ reference, + critic), sequence packing, DCP checkpoints.

Submodules import torch; this package file does not, so `import rlvr.trainer` stays cheap.
Entry points: `model.load_causal_lm` / `model.init_distributed`, `actor.Actor`, `critic.Critic`,
`batch.TrainBatch`, `checkpoint.save_checkpoint` / `load_checkpoint` / `export_hf` (`rlvr.rundir.latest_checkpoint` finds one),
`weights.iter_full_weights`.
"""
