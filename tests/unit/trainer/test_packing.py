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
from rlvr.trainer.step import update_policy

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


@pytest.mark.parametrize("attn", ["rlvr_packed", "sdpa", "eager"])
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
    """Run update_policy with the optimizer step replaced by a snapshot of the gradients."""
    seen = {}

    def snapshot(*_, **__):
        seen.update({n: p.grad.clone() for n, p in actor.model.named_parameters() if p.grad is not None})

    actor.optimizer.step = snapshot
    metrics = update_policy(actor, batch)
    return metrics, seen


def off_policy(batch):
    """old logprobs away from the current policy so ratios (and clipping) are not trivial"""
    old = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(0)) * 0.1 - 4.6
    return batch.replace(old_logprobs=old * batch.response_mask)


def assert_same_update(a, b, batch) -> None:
    """One update_policy of each actor: same loss, grad norm and every gradient."""
    m1, g1 = _grads_of_one_update(a, batch)
    m2, g2 = _grads_of_one_update(b, batch)
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-5)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert g1.keys() == g2.keys() and len(g1) > 0
    for name in g1:
        assert torch.allclose(g1[name], g2[name], atol=1e-5), name


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo"])
def test_packed_and_padded_losses_and_gradients_agree(tiny_model_dir, preset):
    batch = off_policy(make_batch(8, seed=3, max_response=24))
    packed = build_actor(tiny_model_dir, preset=preset, packing=True, max_tokens_per_micro_batch=40, grad_clip=0.0)
    padded = build_actor(tiny_model_dir, preset=preset, packing=False, micro_batch_size=3, grad_clip=0.0)
    assert_same_update(packed, padded, batch)


def test_single_update_uses_the_training_forward_as_pi_old(tiny_model_dir):
    batch = make_batch(6, seed=5)
    shortcut = build_actor(tiny_model_dir, preset="dapo")
    recomputed = build_actor(tiny_model_dir, preset="dapo")
    m1 = update_policy(shortcut, batch)
    m2 = update_policy(recomputed, batch.replace(old_logprobs=recomputed.compute_logprobs(batch)[0]))
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-6) and m1["ratio_mean"] == 1.0
    for p, q in zip(shortcut.model.parameters(), recomputed.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


# -- shared prompts ----------------------------------------------------------------------------
def grouped_batch(groups: int = 3, n: int = 4, *, seed: int = 0, prompt_lens=(6, 1, 9)):
    """`groups` prompts x `n` responses each (GRPO's layout), one prompt of a single token."""
    from rlvr.trainer.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for k in range(groups):
        prompt = torch.randint(4, 90, (prompt_lens[k % len(prompt_lens)],), generator=g).tolist()
        for _ in range(n):
            prompts.append(prompt)
            responses.append(
                torch.randint(4, 90, (int(torch.randint(1, 15, (1,), generator=g)),), generator=g).tolist()
            )
    advantages = torch.randn(len(prompts), generator=g).tolist()
    return TrainBatch.from_sequences(
        prompts, responses, advantages=advantages, group_ids=[i // n for i in range(len(prompts))]
    )


def test_shared_layout_lays_each_prompt_down_once():
    from rlvr.trainer.batch import TrainBatch
    from rlvr.trainer.packing import pack_shared, prompt_units

    batch = TrainBatch.from_sequences([[5, 6, 7], [9], [5, 6, 7]], [[11, 12], [13], [14]])
    units = prompt_units(batch, range(3), budget=100)
    assert units == [[0, 2], [1]]
    mb = pack_shared(batch, units)
    # shared [5, 6], then branches [7, 11, 12] and [7, 14], then the lone sequence [9, 13]
    assert mb.input_ids[0].tolist() == [5, 6, 7, 11, 12, 7, 14, 9, 13]
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 3, 0, 1]
    assert mb.seq_index.tolist() == [0, 2, 1]
    assert mb.targets.tolist() == [11, 12, 14, 13]  # every response token predicted exactly once
    assert mb.num_tokens == 5 + 4 + 2  # tokens/s counts the sequences' tokens, not the row's
    assert mb.segments is not None and [(a, b) for a, b, _ in mb.segments] == [(0, 7), (7, 9)]
    mask = mb.segments[0][2]
    assert mask is not None and mb.segments[1][2] is None
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0],
            [1, 1, 0, 0, 0, 1, 0],  # the second branch sees the prompt, not the first branch
            [1, 1, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask[0, 0], expected)
    assert "rlvr_segments" in mb.model_kwargs() and "cu_seq_lens_q" not in mb.model_kwargs()


def test_shared_units_split_a_group_to_fit_the_budget():
    from rlvr.trainer.packing import prompt_units, unit_tokens

    batch = grouped_batch(groups=2, n=6, prompt_lens=(9,))
    units = prompt_units(batch, range(len(batch)), budget=40)
    assert sorted(i for u in units for i in u) == list(range(len(batch)))
    assert all(unit_tokens(batch, u) <= 40 or len(u) == 1 for u in units)
    assert all(len({int(batch.group_ids[i]) for i in u}) == 1 for u in units)


@pytest.mark.parametrize(("entropy", "lora"), [("detached", False), ("grad", False), ("detached", True)])
def test_shared_prompts_give_the_same_logprobs(tiny_model_dir, entropy, lora):
    batch = grouped_batch()
    model = load_hf_model(ModelConfig(path=str(tiny_model_dir)), attn_implementation="rlvr_packed")
    if lora:  # peft's wrapper must hand the segments down to the attention
        from rlvr.recipe.schema import LoraConfig
        from rlvr.trainer.lora import apply_lora

        model = apply_lora(model, LoraConfig(rank=4), seed=0)
    shared = make_micro_batches(batch, packing=True, max_tokens=64, micro_batch_size=1,
                                attn_implementation="rlvr_packed", share_prompts=True)  # fmt: skip
    assert len(shared) > 1 and all(mb.segments is not None for mb in shared)
    assert sum(int(mb.input_ids.shape[1]) for mb in shared) < int(batch.seq_lens.sum())  # prompts run once
    reference, ref_ent = token_logprobs(model, pad_sequences(batch, list(range(len(batch)))), entropy=entropy)
    mask = batch.response_mask.bool()
    for mb in shared:
        logp, ent = token_logprobs(model, mb, entropy=entropy)
        rows = mb.seq_index
        width = logp.shape[1]
        m = mask[rows, :width]
        assert torch.allclose(logp[m], reference[rows, :width][m], atol=1e-5)
        assert ent is not None and ref_ent is not None
        assert torch.allclose(ent[m], ref_ent[rows, :width][m], atol=1e-5)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def _recorded_micro_batches(actor) -> list:
    """Every micro-batch `actor` runs from now on (its trainer's `micro_batches`, spied on)."""
    seen: list = []
    real = actor.trainer.micro_batches

    def recording(local):
        mbs = real(local)
        seen.extend(mb for mb in mbs if mb is not None)
        return mbs

    actor.trainer.micro_batches = recording
    return seen


def test_shared_prompts_give_the_same_loss_and_gradients(tiny_model_dir):
    batch = off_policy(grouped_batch(seed=4))
    shared = build_actor(tiny_model_dir, packing=True, share_prompts=True, max_tokens_per_micro_batch=48, grad_clip=0.0)
    plain = build_actor(tiny_model_dir, packing=True, share_prompts=False, max_tokens_per_micro_batch=48, grad_clip=0.0)
    ran_shared, ran_plain = _recorded_micro_batches(shared), _recorded_micro_batches(plain)
    assert_same_update(shared, plain, batch)
    # the prompts were shared: every micro-batch in the shared layout, and fewer tokens run than
    # without (each group's prompt once, not once per response)
    assert ran_shared and all(mb.segments is not None for mb in ran_shared)
    assert ran_plain and all(mb.segments is None for mb in ran_plain)
    tokens = [sum(mb.input_ids.numel() for mb in ran) for ran in (ran_shared, ran_plain)]
    assert tokens[0] < tokens[1], tokens
    assert sorted(int(i) for mb in ran_shared for i in mb.seq_index) == sorted(
        int(i) for mb in ran_plain for i in mb.seq_index
    )  # the same rows, each once per pass


def test_shared_prompts_give_the_same_values(tiny_model_dir):
    from rlvr.trainer.forward import token_values

    batch = grouped_batch(seed=2)
    critic = load_hf_model(ModelConfig(path=str(tiny_model_dir)), kind="value")
    reference = token_values(critic, pad_sequences(batch, list(range(len(batch)))))
    mask = batch.response_mask.bool()
    for mb in make_micro_batches(batch, packing=True, max_tokens=64, micro_batch_size=1,
                                 attn_implementation="rlvr_packed", share_prompts=True):  # fmt: skip
        values = token_values(critic, mb)
        rows, width = mb.seq_index, values.shape[1]
        m = mask[rows, :width]
        assert torch.allclose(values[m], reference[rows, :width][m], atol=1e-5)


def test_rank_shares_keep_a_group_on_one_rank():
    from rlvr.trainer.packing import rank_share

    batch = grouped_batch(groups=4, n=4)
    shares = [rank_share(batch, parts=2, rank=r, budget=1000, share_prompts=True) for r in range(2)]
    assert sorted(i for s in shares for i in s) == list(range(len(batch)))  # every row once
    rank_of = {i: r for r, share in enumerate(shares) for i in share}
    for g in range(4):  # whole groups: every row of a group on the same rank
        assert len({rank_of[i] for i in range(len(batch)) if int(batch.group_ids[i]) == g}) == 1
    assert all(shares)
    few = [rank_share(batch.select(list(range(4))), parts=2, rank=r, budget=1000, share_prompts=True) for r in range(2)]
    assert all(few)  # one group, two ranks: split by tokens so no rank idles
