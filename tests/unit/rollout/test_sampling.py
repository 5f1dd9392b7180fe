from __future__ import annotations

import math

import torch

from rlvr.rollout.base import SamplingParams
from rlvr.server.sampling import RowSampling, sample_greedy, sample_plain, sample_rows


def _row(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, uniform=0.5) -> RowSampling:
    return RowSampling(temperature, top_p, top_k, min_p, uniform)


def test_greedy_rows_take_argmax_and_report_raw_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    tokens, logprobs = sample_rows(logits, [_row(temperature=0.0), _row(top_k=1, temperature=0.5)])
    assert tokens == [1, 0]
    raw = torch.log_softmax(logits, -1)
    assert math.isclose(logprobs[0], raw[0, 1].item(), abs_tol=1e-6)
    assert math.isclose(logprobs[1], raw[1, 0].item(), abs_tol=1e-6)


def test_sampled_logprobs_are_temperature_scaled_like_sglang_default():
    logits = torch.tensor([[0.5, 1.0, -1.0, 2.0]])
    tokens, logprobs = sample_rows(logits, [_row(temperature=0.7, uniform=0.3)])
    scaled = torch.log_softmax(logits / 0.7, -1)
    assert math.isclose(logprobs[0], scaled[0, tokens[0]].item(), abs_tol=1e-6)
    _, original = sample_rows(logits, [_row(temperature=0.7, uniform=0.3)], original=True)
    assert math.isclose(original[0], torch.log_softmax(logits, -1)[0, tokens[0]].item(), abs_tol=1e-6)


def test_inverse_cdf_maps_uniforms_to_tokens_in_probability_order():
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.5]]))
    picks = [sample_rows(logits, [_row(uniform=u)])[0][0] for u in (0.1, 0.3, 0.6, 0.99)]
    assert picks == [0, 1, 2, 2]


def test_top_k_top_p_min_p_restrict_the_support():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(3, 1)
    seen: list[set[int]] = [set(), set(), set()]
    for i in range(50):
        u = (i + 0.5) / 50
        rows = [_row(top_k=2, uniform=u), _row(top_p=0.7, uniform=u), _row(min_p=0.4, uniform=u)]
        for j, token in enumerate(sample_rows(logits, rows)[0]):
            seen[j].add(token)
    assert seen[0] == {0, 1}  # top-k 2
    assert seen[1] == {0, 1}  # 0.5 < 0.7 needs the second token, not the third
    assert seen[2] == {0, 1}  # >= 0.4 * 0.5


def test_mixed_batch_rows_are_independent():
    logits = torch.randn(4, 50)
    rows = [_row(uniform=0.2), _row(temperature=0.0), _row(top_p=0.5, uniform=0.9), _row(top_k=5, uniform=0.4)]
    together = sample_rows(logits, rows)[0]
    alone = [sample_rows(logits[i : i + 1], [rows[i]])[0][0] for i in range(4)]
    assert together == alone


def test_sampling_params_round_trip_sglang_fields():
    params = SamplingParams(temperature=0.3, top_k=5, stop=["\n"], stop_token_ids=[7], seed=11, max_new_tokens=9)
    wire = params.to_sglang()
    assert wire["sampling_seed"] == 11 and wire["stop"] == ["\n"] and wire["stop_token_ids"] == [7]
    assert SamplingParams.from_sglang(wire) == params
    assert SamplingParams.from_sglang({"stop": "x"}).stop == ["x"]


def test_fast_paths_pick_what_the_general_sampler_picks():
    """The engine takes `sample_plain`/`sample_greedy` when every row allows it; a row's token
    must not depend on which path its batch took (seeded runs reproduce across batchings)."""
    torch.manual_seed(0)
    logits = torch.randn(16, 50) * 3
    temps = [0.3 + 0.1 * i for i in range(16)]
    uniforms = torch.rand(16).tolist()
    general = sample_rows(logits, [_row(temperature=t, uniform=u) for t, u in zip(temps, uniforms, strict=True)])
    plain = sample_plain(logits, temps, uniforms)
    assert plain[0] == general[0]
    torch.testing.assert_close(torch.tensor(plain[1]), torch.tensor(general[1]))
    greedy = sample_greedy(logits)
    assert greedy[0] == sample_rows(logits, [_row(temperature=0.0)] * 16)[0]
    torch.testing.assert_close(torch.tensor(greedy[1]), torch.log_softmax(logits, -1).max(-1).values)
