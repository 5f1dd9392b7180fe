"""The step's batch as flat arrays: `RolloutBatch.pack` and `TrainBatch.from_rollout`/`from_flat`.

Checked against a padding written the obvious way (one row at a time) in this file, on rows of
uneven lengths with both kinds of loss mask (one number per response, one per token) and an
empty response."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlvr.trainer.batch import TrainBatch
from rlvr.types import RolloutBatch

PROMPTS = [[5, 6, 7], [8], [9, 10], [11, 12, 13, 14]]
RESPONSES = [[20, 21], [22, 23, 24, 25], [], [26]]
LOGPROBS = [[-0.5, -1.5], [-0.1, -0.2, -0.3, -0.4], [], [-2.0]]
MASKS: list[float | list[float]] = [1.0, [1.0, 0.0, 0.0, 1.0], 0.0, 0.0]


def rows_batch() -> RolloutBatch:
    batch = RolloutBatch()
    for i in range(4):
        batch.prompts.append(PROMPTS[i])
        batch.responses.append(RESPONSES[i])
        batch.rollout_logprobs.append(LOGPROBS[i])
        batch.loss_masks.append(MASKS[i])
        batch.rewards.append(float(i))
        batch.group_ids.append(i // 2)
        batch.domains.append("math")
        batch.versions.append(3 - i % 2)
    return batch


def padded_by_hand(pad_id: int) -> dict[str, torch.Tensor]:
    T = max(len(r) for r in RESPONSES)
    L = max(len(p) + len(r) for p, r in zip(PROMPTS, RESPONSES, strict=True))
    ids = torch.full((4, L), pad_id, dtype=torch.long)
    mask, logprobs = torch.zeros(4, T), torch.zeros(4, T)
    for b, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        for j, token in enumerate(p + r):
            ids[b, j] = token
        for j in range(len(r)):
            m = MASKS[b]
            mask[b, j] = m[j] if isinstance(m, list) else m
            logprobs[b, j] = LOGPROBS[b][j]
    return {"input_ids": ids, "response_mask": mask, "rollout_logprobs": logprobs}


def test_pack_keeps_every_row_and_stores_flat_arrays() -> None:
    batch = rows_batch().pack()
    a = batch.arrays()
    assert a["response_ids"].dtype == np.int32 and a["logprobs"].dtype == np.float32
    assert a["response_ids"].tolist() == [t for r in RESPONSES for t in r]
    assert a["response_offsets"].tolist() == [0, 2, 6, 6, 7]
    assert a["loss_mask"].tolist() == [1, 1, 1, 0, 0, 1, 0]
    # the row views give back what was put in, a whole-response mask as one number
    assert batch.prompts == PROMPTS and batch.responses == RESPONSES and batch.loss_masks == MASKS
    assert batch.rollout_logprobs == [[pytest.approx(x) for x in row] for row in LOGPROBS]
    assert batch.rewards == [0.0, 1.0, 2.0, 3.0] and batch.num_tokens == 7 and min(batch.versions) < 3
    assert all(isinstance(row, list) for row in batch.responses)  # plain lists: json, pickle, ==


def test_pack_rejects_a_mask_of_the_wrong_length() -> None:
    batch = rows_batch()
    batch.loss_masks[1] = [1.0, 0.0]
    with pytest.raises(ValueError, match="row 1: 2 loss-mask values for a 4-token response"):
        batch.pack()


@pytest.mark.parametrize("pad_id", [0, 3])
def test_from_rollout_pads_as_a_row_by_row_layout_would(pad_id: int) -> None:
    expected = padded_by_hand(pad_id)
    for rollout in (rows_batch(), rows_batch().pack()):
        batch = TrainBatch.from_rollout(rollout, pad_id=pad_id)
        for name, tensor in expected.items():
            assert torch.equal(getattr(batch, name), tensor), name
        assert batch.prompt_lens.tolist() == [3, 1, 2, 4] and batch.response_lens.tolist() == [2, 4, 0, 1]
        assert batch.group_ids.tolist() == [0, 0, 1, 1] and batch.rewards is not None
        assert batch.rewards.tolist() == [0.0, 1.0, 2.0, 3.0]
        assert not batch.advantages.any()


def test_from_sequences_matches_from_rollout_and_spreads_scalars() -> None:
    rows = TrainBatch.from_sequences(PROMPTS, RESPONSES, rollout_logprobs=LOGPROBS, response_masks=MASKS,
                                     advantages=[1.0, [2.0, 3.0, 4.0, 5.0], 0.5, -1.0])  # fmt: skip
    flat = TrainBatch.from_rollout(rows_batch())
    assert torch.equal(rows.input_ids, flat.input_ids) and torch.equal(rows.response_mask, flat.response_mask)
    assert torch.equal(rows.rollout_logprobs, flat.rollout_logprobs)  # type: ignore[arg-type]
    assert rows.advantages.tolist() == [[1, 1, 0, 0], [2, 3, 4, 5], [0, 0, 0, 0], [-1, 0, 0, 0]]


def test_from_flat_rejects_offsets_that_disagree_with_the_ids() -> None:
    with pytest.raises(ValueError, match="offsets"):
        TrainBatch.from_flat(prompt_ids=np.array([1, 2]), prompt_offsets=np.array([0, 2]),
                             response_ids=np.array([3]), response_offsets=np.array([0, 2]))  # fmt: skip
    with pytest.raises(ValueError, match="at least one token"):
        TrainBatch.from_flat(prompt_ids=np.array([], dtype=np.int64), prompt_offsets=np.array([0, 0]),
                             response_ids=np.array([3]), response_offsets=np.array([0, 1]))  # fmt: skip
