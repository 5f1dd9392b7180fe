"""`TrainBatch`: what the trainer consumes, as padded torch tensors.

Sequences keep their own lengths (`prompt_lens`, `response_lens`) so packing can lay them
end to end without padding, while every per-token field lives in *response space*:
`[B, T]` with `T` the longest response, column `j` being response token `j`. That is the
layout the algorithm functions (`rlvr.algorithms`) take, so nothing is re-indexed between
the trainer and the loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Per-token fields in response space ([B, T]); per-sequence fields ([B]).
TOKEN_FIELDS = (
    "response_mask",
    "advantages",
    "returns",
    "old_logprobs",
    "rollout_logprobs",
    "ref_logprobs",
    "old_values",
)
SEQ_FIELDS = ("prompt_lens", "response_lens", "group_ids", "rewards")


@dataclass(slots=True)
class TrainBatch:
    """B sequences (prompt + response) with everything the actor and critic losses need.

    `input_ids[b, :prompt_lens[b] + response_lens[b]]` is sequence b (right-padded with
    `pad_id`). `response_mask` is the *loss* mask: the loop may zero a whole truncated
    response (overlong masking) while its tokens still run through the model.
    Optional fields are filled along the way: `old_logprobs` by `Actor.compute_logprobs`
    when not taken from the rollout, `ref_logprobs` by the reference model, `old_values` by
    the critic.
    """

    input_ids: torch.Tensor
    prompt_lens: torch.Tensor
    response_lens: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    group_ids: torch.Tensor
    returns: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    rollout_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    pad_id: int = 0

    @classmethod
    def from_sequences(
        cls,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        advantages: Sequence[float | Sequence[float]] | None = None,
        returns: Sequence[float | Sequence[float]] | None = None,
        rollout_logprobs: Sequence[Sequence[float]] | None = None,
        old_logprobs: Sequence[Sequence[float]] | None = None,
        ref_logprobs: Sequence[Sequence[float]] | None = None,
        response_masks: Sequence[float | Sequence[float]] | None = None,
        group_ids: Sequence[int] | None = None,
        rewards: Sequence[float] | None = None,
        pad_id: int = 0,
    ) -> TrainBatch:
        """Build from token-id lists; a scalar advantage/return/mask is spread over its response.

        `advantages` may be left out (zeros) when the batch only feeds `compute_logprobs`
        before advantages exist (KL-in-reward needs reference logprobs first).
        """
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token (it predicts the first response token)")
        n = len(prompts)
        plens = [len(p) for p in prompts]
        rlens = [len(r) for r in responses]
        T = max([1, *rlens])
        L = max([1, *(p + r for p, r in zip(plens, rlens, strict=True))])
        ids = torch.full((n, L), pad_id, dtype=torch.long)
        for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            seq = list(p) + list(r)
            ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)

        def tok(values: Sequence[float | Sequence[float]] | None, default: float | None) -> torch.Tensor | None:
            if values is None:
                if default is None:
                    return None
                values = [default] * n
            if len(values) != n:
                raise ValueError(f"expected {n} rows, got {len(values)}")
            out = torch.zeros((n, T), dtype=torch.float32)
            for b, v in enumerate(values):
                if isinstance(v, int | float):
                    out[b, : rlens[b]] = float(v)
                else:
                    if len(v) != rlens[b]:
                        raise ValueError(f"row {b}: {len(v)} values for a {rlens[b]}-token response")
                    out[b, : rlens[b]] = torch.tensor(list(v), dtype=torch.float32)
            return out

        mask = tok(response_masks, 1.0)
        adv = tok(advantages, 0.0)
        assert mask is not None and adv is not None
        return cls(
            input_ids=ids,
            prompt_lens=torch.tensor(plens, dtype=torch.long),
            response_lens=torch.tensor(rlens, dtype=torch.long),
            response_mask=mask,
            advantages=adv,
            group_ids=torch.tensor(list(group_ids) if group_ids is not None else range(n), dtype=torch.long),
            returns=tok(returns, None),
            old_logprobs=tok(old_logprobs, None),
            rollout_logprobs=tok(rollout_logprobs, None),
            ref_logprobs=tok(ref_logprobs, None),
            rewards=torch.tensor(list(rewards), dtype=torch.float32) if rewards is not None else None,
            pad_id=pad_id,
        )

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_lens(self) -> torch.Tensor:
        """Prompt + response length per sequence: the tokens a forward pass costs."""
        return self.prompt_lens + self.response_lens

    @property
    def max_response_len(self) -> int:
        return int(self.response_mask.shape[1])

    def tokens(self, b: int) -> torch.Tensor:
        """Sequence b's prompt + response ids, unpadded."""
        return self.input_ids[b, : int(self.seq_lens[b])]

    def replace(self, **changes: torch.Tensor | None) -> TrainBatch:
        """A copy with some fields swapped (e.g. `old_logprobs=...` after recomputing them)."""
        return dataclasses.replace(self, **changes)  # pyright: ignore[reportArgumentType]

    def select(self, index: Sequence[int] | torch.Tensor) -> TrainBatch:
        """The sub-batch of these rows, in this order; response width `T` is kept."""
        idx = torch.as_tensor(index, dtype=torch.long)
        changes: dict[str, torch.Tensor | None] = {"input_ids": self.input_ids[idx]}
        for name in TOKEN_FIELDS + SEQ_FIELDS:
            value = getattr(self, name)
            changes[name] = value[idx] if value is not None else None
        return dataclasses.replace(self, **changes)  # pyright: ignore[reportArgumentType]

    def split(self, n: int) -> list[TrainBatch]:
        """n contiguous chunks whose sizes differ by at most one (mini-batches, or ranks).

        Contiguous, so mini-batch j is the same rows whatever the world size: that keeps
        a 1-rank and an N-rank run on the same optimisation path.
        """
        if n < 1:
            raise ValueError(f"split needs n >= 1, got {n}")
        return [self.select(chunk) for chunk in torch.arange(len(self)).tensor_split(n)]

    def to(self, device: torch.device | str) -> TrainBatch:
        changes = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **changes)  # pyright: ignore[reportArgumentType]
