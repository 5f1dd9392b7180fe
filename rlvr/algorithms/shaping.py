"""From scored groups to the rewards and masks the trainer sees: DAPO's soft overlong penalty,
per-domain reward normalisation and overlong masking.

`RewardShaping` keeps one running mean/std per domain with `reward_norm = "domain"`. It is updated
only as batches are built, in step order, so a resumed run normalises exactly as a straight one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rlvr.algorithms.advantages import RunningMoments
from rlvr.algorithms.filters import soft_overlong_penalty
from rlvr.recipe.schema import AlgorithmConfig, RolloutConfig
from rlvr.types import Group, RolloutBatch


class RewardShaping:
    """Shaped rewards of a group (what the filters and advantages see) and the batch of trained groups.

    `episode_tokens` maps a tool domain to its episode's token budget; every other domain's
    responses are bounded by `rollout.max_new_tokens`. `normalized` names the domains whose rewards
    are normalised by their running statistics.
    """

    def __init__(
        self,
        algorithm: AlgorithmConfig,
        *,
        rollout: RolloutConfig,
        episode_tokens: Mapping[str, int],
        normalized: Iterable[str],
    ) -> None:
        self.algorithm = algorithm
        self.rollout = rollout
        self.episode_tokens = dict(episode_tokens)
        self.domain_stats = {name: RunningMoments() for name in normalized}

    def shaped_rewards(self, group: Group) -> list[float]:
        """Scores plus DAPO's soft overlong penalty."""
        algo = self.algorithm
        if not algo.overlong_buffer:
            return group.scores
        max_new_tokens = self.episode_tokens.get(group.sample.domain, self.rollout.max_new_tokens)
        return [
            score
            + soft_overlong_penalty(
                len(c.token_ids),
                max_new_tokens=max_new_tokens,
                buffer=algo.overlong_buffer,
                penalty=algo.overlong_penalty,
            )
            for score, c in zip(group.scores, group.completions, strict=True)
        ]

    def build_batch(self, groups: Sequence[Group]) -> RolloutBatch:
        """The trained groups in order; per-domain normalisation is updated here, in step order."""
        batch = RolloutBatch()
        for group_id, group in enumerate(groups):
            rewards = self.shaped_rewards(group)
            stats = self.domain_stats.get(group.sample.domain)
            if stats is not None:
                stats.update(rewards)
                rewards = [stats.normalize(x) for x in rewards]
            masks = [
                0.0 if (self.algorithm.overlong_mask and c.finish_reason == "length") or not c.token_ids else 1.0
                for c in group.completions
            ]
            batch.add_group(group, rewards, masks, group_id)
        return batch.pack()  # flat arrays: what is broadcast and laid out, never rows of Python numbers

    def state_dict(self) -> dict[str, dict[str, float]]:
        return {name: stats.state_dict() for name, stats in self.domain_stats.items()}

    def load_state_dict(self, state: Mapping[str, dict[str, float]]) -> None:
        for name, stats in self.domain_stats.items():
            stats.load_state_dict(state[name])
