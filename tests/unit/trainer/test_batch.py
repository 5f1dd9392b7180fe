from __future__ import annotations

import pytest
import torch

from rlvr.trainer.batch import TrainBatch


def test_from_sequences_lays_out_response_space():
    b = TrainBatch.from_sequences(
        [[5, 6, 7], [8]],
        [[10, 11], [12, 13, 14]],
        advantages=[1.5, [0.1, 0.2, 0.3]],
        rollout_logprobs=[[-1, -2], [-3, -4, -5]],
    )
    assert b.input_ids.tolist() == [[5, 6, 7, 10, 11], [8, 12, 13, 14, 0]]
    assert b.prompt_lens.tolist() == [3, 1] and b.response_lens.tolist() == [2, 3]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert b.advantages[0].tolist() == [1.5, 1.5, 0.0]
    assert torch.allclose(b.advantages[1], torch.tensor([0.1, 0.2, 0.3]))
    assert b.rollout_logprobs is not None and b.rollout_logprobs[0].tolist() == [-1, -2, 0]
    assert b.old_logprobs is None and b.group_ids.tolist() == [0, 1]
    assert b.tokens(1).tolist() == [8, 12, 13, 14]


def test_from_sequences_rejects_bad_rows():
    with pytest.raises(ValueError, match="at least one token"):
        TrainBatch.from_sequences([[]], [[1]], advantages=[0.0])
    with pytest.raises(ValueError, match="3-token response"):
        TrainBatch.from_sequences([[1]], [[1, 2, 3]], advantages=[[0.0]])


def test_split_is_contiguous_and_keeps_width():
    b = TrainBatch.from_sequences([[1]] * 5, [[2] * k for k in range(1, 6)], advantages=[0, 1, 2, 3, 4])
    parts = b.split(2)
    assert [len(p) for p in parts] == [3, 2]
    assert parts[1].advantages[:, 0].tolist() == [3.0, 4.0]
    assert all(p.max_response_len == 5 for p in parts)
    assert [len(p) for p in b.split(7)] == [1, 1, 1, 1, 1, 0, 0]
