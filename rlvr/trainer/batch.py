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

import numpy as np
import torch

from rlvr.trainer.typed_torch import from_numpy
from rlvr.types import RolloutBatch, flat_rows, row_offsets

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
        before advantages exist (KL-in-reward needs reference logprobs first). Each row is
        converted to numpy in C, then laid out as `from_flat` does.
        """
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        n = len(prompts)
        rlens = np.fromiter((len(r) for r in responses), dtype=np.int64, count=n)

        def tok(values: Sequence[float | Sequence[float]] | None) -> np.ndarray | None:
            if values is None:
                return None
            if len(values) != n:
                raise ValueError(f"expected {n} rows, got {len(values)}")
            parts: list[np.ndarray] = []
            for b, v in enumerate(values):
                if isinstance(v, int | float):
                    parts.append(np.full(int(rlens[b]), v, dtype=np.float32))
                elif len(v) != rlens[b]:
                    raise ValueError(f"row {b}: {len(v)} values for a {rlens[b]}-token response")
                else:
                    parts.append(np.asarray(v, dtype=np.float32))
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

        return cls.from_flat(
            prompt_ids=flat_rows(prompts, np.int64),
            prompt_offsets=row_offsets(np.fromiter((len(p) for p in prompts), dtype=np.int64, count=n)),
            response_ids=flat_rows(responses, np.int64),
            response_offsets=row_offsets(rlens),
            response_mask=tok(response_masks),
            advantages=tok(advantages),
            returns=tok(returns),
            rollout_logprobs=tok(rollout_logprobs),
            old_logprobs=tok(old_logprobs),
            ref_logprobs=tok(ref_logprobs),
            group_ids=np.asarray(list(group_ids), dtype=np.int64) if group_ids is not None else None,
            rewards=np.asarray(list(rewards), dtype=np.float32) if rewards is not None else None,
            pad_id=pad_id,
        )

    @classmethod
    def from_rollout(cls, rollout: RolloutBatch, *, pad_id: int = 0) -> TrainBatch:
        """The step's batch from the rollouts' flat arrays (no advantages yet: zeros)."""
        a = rollout.arrays()
        return cls.from_flat(
            prompt_ids=a["prompt_ids"],
            prompt_offsets=a["prompt_offsets"],
            response_ids=a["response_ids"],
            response_offsets=a["response_offsets"],
            response_mask=a["loss_mask"],
            rollout_logprobs=a["logprobs"],
            group_ids=a["group_ids"],
            rewards=a["rewards"],
            pad_id=pad_id,
        )

    @classmethod
    def from_flat(
        cls,
        *,
        prompt_ids: np.ndarray,
        prompt_offsets: np.ndarray,
        response_ids: np.ndarray,
        response_offsets: np.ndarray,
        response_mask: np.ndarray | None = None,
        advantages: np.ndarray | None = None,
        returns: np.ndarray | None = None,
        rollout_logprobs: np.ndarray | None = None,
        old_logprobs: np.ndarray | None = None,
        ref_logprobs: np.ndarray | None = None,
        group_ids: np.ndarray | None = None,
        rewards: np.ndarray | None = None,
        pad_id: int = 0,
    ) -> TrainBatch:
        """Pad flat arrays into the batch: row i is `ids[offsets[i]:offsets[i + 1]]`, per-token fields
        are flat along the responses (as `RolloutBatch.arrays()` holds them).

        Every token's cell in the padded tensors is computed once, as a flat index, and each field is
        one numpy scatter into its tensor's memory: no Python step per row or token. (A torch
        boolean-mask scatter measured 5x slower than numpy's on one thread; a loop over rows ~30x.)
        A missing mask is 1 on every response token, missing advantages are 0.
        """
        poff = np.asarray(prompt_offsets, dtype=np.int64)
        roff = np.asarray(response_offsets, dtype=np.int64)
        plens, rlens = np.diff(poff), np.diff(roff)
        n = len(plens)
        if len(rlens) != n:
            raise ValueError(f"{n} prompts but {len(rlens)} responses")
        if (plens <= 0).any():
            raise ValueError("every prompt needs at least one token (it predicts the first response token)")
        if (rlens < 0).any() or len(prompt_ids) != poff[-1] or len(response_ids) != roff[-1]:
            raise ValueError("token ids and offsets disagree: offsets must rise and end at the number of ids")
        T = max(1, int(rlens.max(initial=0)))
        L = max(1, int((plens + rlens).max(initial=0)))
        total = int(roff[-1])
        # Flat cell of each token: row start + its place in the row (= flat index - the row's offset).
        in_row = np.arange(total, dtype=np.int64) - np.repeat(roff[:-1], rlens)
        cell_T = np.repeat(np.arange(n, dtype=np.int64) * T, rlens) + in_row
        # numpy's zeros come from calloc: padding never written stays the kernel's zero page (no RSS,
        # no memset), where torch.zeros would touch every padded cell of a long-tailed batch.
        ids = from_numpy(np.zeros((n, L), dtype=np.int64) if pad_id == 0 else np.full((n, L), pad_id, np.int64))
        flat_ids = ids.numpy().reshape(-1)
        flat_ids[np.repeat(np.arange(n, dtype=np.int64) * L - poff[:-1], plens) + np.arange(int(poff[-1]))] = prompt_ids
        flat_ids[np.repeat(np.arange(n, dtype=np.int64) * L + plens, rlens) + in_row] = response_ids
        del in_row

        def tok(name: str, values: np.ndarray | None, *, default: float | None = None) -> torch.Tensor | None:
            if values is None and default is None:
                return None
            out = from_numpy(np.zeros((n, T), dtype=np.float32))
            if values is None:
                out.numpy().reshape(-1)[cell_T] = default
            elif len(values) != total:
                raise ValueError(f"{name}: {len(values)} values for {total} response tokens")
            else:
                out.numpy().reshape(-1)[cell_T] = values
            return out

        mask = tok("response_mask", response_mask, default=1.0)
        adv = tok("advantages", advantages, default=0.0)
        assert mask is not None and adv is not None
        return cls(
            input_ids=ids,
            prompt_lens=from_numpy(plens),
            response_lens=from_numpy(rlens),
            response_mask=mask,
            advantages=adv,
            group_ids=torch.tensor(group_ids, dtype=torch.long) if group_ids is not None else torch.arange(n),
            returns=tok("returns", returns),
            old_logprobs=tok("old_logprobs", old_logprobs),
            rollout_logprobs=tok("rollout_logprobs", rollout_logprobs),
            ref_logprobs=tok("ref_logprobs", ref_logprobs),
            rewards=torch.tensor(rewards, dtype=torch.float32) if rewards is not None else None,
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
