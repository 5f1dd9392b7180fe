from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.recipe.schema import ModelConfig
from rlvr.trainer.forward import token_logprobs
from rlvr.trainer.model import load_hf_model
from rlvr.trainer.packing import (
    balance_partition,
    block_causal_mask,
    first_fit_decreasing,
    make_micro_batches,
    pack_sequences,
    pad_sequences,
    unpack,
)

from .conftest import build_actor, make_batch


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=30), st.integers(16, 80))
def test_first_fit_decreasing_respects_budget_and_covers_all(lengths, budget):
    bins = first_fit_decreasing(lengths, budget=budget)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        assert sum(lengths[i] for i in b) <= budget or len(b) == 1
    assert first_fit_decreasing(lengths, budget=budget) == bins  # deterministic


def test_balance_partition_evens_out_tokens():
    lengths = [10, 9, 1, 1, 1, 8, 3, 7]
    groups = balance_partition(lengths, parts=2)
    loads = [sum(lengths[i] for i in g) for g in groups]
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert abs(loads[0] - loads[1]) <= 2


def test_block_causal_mask():
    allowed = block_causal_mask([2, 3])[0, 0]
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(allowed, expected)
    additive = block_causal_mask([2, 3], dtype=torch.float32)[0, 0]
    assert torch.equal(additive == 0, expected) and additive.min() == torch.finfo(torch.float32).min


def test_packed_layout_restarts_positions_and_marks_response_positions(batch):
    mb = pack_sequences(batch, [0, 1], attn_implementation="flash_attention_2")
    lens = [int(batch.seq_lens[i]) for i in (0, 1)]
    assert mb.attention_mask is None  # varlen kernels get the boundaries instead of a mask
    assert mb.cu_seqlens is not None and mb.cu_seqlens.tolist() == [0, lens[0], lens[0] + lens[1]]
    assert mb.model_kwargs()["max_length_q"] == max(lens)
    assert mb.position_ids[0].tolist() == list(range(lens[0])) + list(range(lens[1]))
    assert int(mb.predict_mask.sum()) == int(batch.response_lens[:2].sum())
    responses = [batch.tokens(i)[int(batch.prompt_lens[i]) :] for i in (0, 1)]
    assert torch.equal(mb.targets, torch.cat(responses))
    out = unpack(mb.targets.float(), mb)
    assert out[1, : len(responses[1])].tolist() == responses[1].float().tolist()


def test_micro_batches_stay_under_the_token_budget():
    b = make_batch(12, max_response=30)
    mbs = make_micro_batches(b, packing=True, max_tokens=48, micro_batch_size=1)
    assert sorted(int(i) for mb in mbs for i in mb.seq_index) == list(range(12))
    for mb in mbs:
        assert mb.input_ids.shape[0] == 1 and (mb.input_ids.shape[1] <= 48 or mb.num_seqs == 1)


@pytest.mark.parametrize("attn", ["rlvr_packed_sdpa", "sdpa", "eager"])
def test_packed_and_padded_logprobs_agree(tiny_model_dir, batch, attn):
    model = load_hf_model(ModelConfig(path=str(tiny_model_dir)), attn_implementation=attn)
    idx = list(range(len(batch)))
    packed, ent_p = token_logprobs(model, pack_sequences(batch, idx, attn_implementation=attn))
    padded, ent_q = token_logprobs(model, pad_sequences(batch, idx))
    mask = batch.response_mask[:, : packed.shape[1]].bool()
    assert torch.allclose(packed[mask], padded[mask], atol=1e-5)
    assert ent_p is not None and ent_q is not None and torch.allclose(ent_p[mask], ent_q[mask], atol=1e-5)
    assert (packed[~mask] == 0).all()


def _grads_of_one_update(actor, batch):
    """Run train_step with the optimizer step replaced by a snapshot of the gradients."""
    seen = {}

    def snapshot(*_, **__):
        seen.update({n: p.grad.clone() for n, p in actor.model.named_parameters() if p.grad is not None})

    actor.optimizer.step = snapshot
    metrics = actor.train_step(batch)
    return metrics, seen


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo"])
def test_packed_and_padded_losses_and_gradients_agree(tiny_model_dir, preset):
    batch = make_batch(8, seed=3, max_response=24)
    # old logprobs away from the current policy so ratios (and clipping) are not trivial
    old = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(0)) * 0.1 - 4.6
    batch = batch.replace(old_logprobs=old * batch.response_mask)
    packed = build_actor(tiny_model_dir, preset=preset, packing=True, max_tokens_per_micro_batch=40, grad_clip=0.0)
    padded = build_actor(tiny_model_dir, preset=preset, packing=False, micro_batch_size=3, grad_clip=0.0)
    m1, g1 = _grads_of_one_update(packed, batch)
    m2, g2 = _grads_of_one_update(padded, batch)
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-5)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert g1.keys() == g2.keys() and len(g1) > 0
    for name in g1:
        assert torch.allclose(g1[name], g2[name], atol=1e-5), name


def test_single_update_uses_the_training_forward_as_pi_old(tiny_model_dir):
    batch = make_batch(6, seed=5)
    shortcut = build_actor(tiny_model_dir, preset="dapo")
    recomputed = build_actor(tiny_model_dir, preset="dapo")
    m1 = shortcut.train_step(batch)
    m2 = recomputed.train_step(batch.replace(old_logprobs=recomputed.compute_logprobs(batch)[0]))
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-6) and m1["ratio_mean"] == 1.0
    for p, q in zip(shortcut.model.parameters(), recomputed.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
