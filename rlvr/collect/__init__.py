"""Rank 0's rollout collection: `RolloutManager` (manager.py) composes the parts, one job each.

- ``bridge``: the manager's own thread and event loop, reached from the trainer's thread.
- ``prompts``: prompt token ids (an LRU filled off the event loop), prompt text, the length limit.
- ``episodes``: a group's episodes and scores on the engines; held-out evaluation.
- ``ledger``: every group started ends exactly once; unjudged samples; the failure budget.
- ``scheduler``: waves admitted by the staleness gate, and the order of their refills.
- ``rounds``: one wave's rounds: generate, judge, filter, refill.
- ``metrics``: reward, group, staleness and idle-time metrics of a wave.
"""
