"""Chunked log-probs (rlvr.trainer.chunked_logprobs) against the full [K, V] logits: values and
gradients, on the bare op and through `token_logprobs` on tiny models (tied and untied heads,
LoRA, torchtitan, a model that changes its head's output)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rlvr.recipe.schema import LoraConfig, ModelConfig, TrainerConfig
from rlvr.tiny import tiny_config
from rlvr.trainer.chunked_logprobs import ChunkedLogprobs, chunked_token_logprobs
from rlvr.trainer.forward import UNCHUNKED_MARK, _plain_head, token_logprobs
from rlvr.trainer.hf import load_hf_model
from rlvr.trainer.model import build_model
from rlvr.trainer.packing import pack_sequences, pad_sequences

from .conftest import make_batch

TOL = 1e-5
MODES = ["none", "detached", "grad"]
CPU = torch.device("cpu")


def full_reference(h, weight, bias, targets, *, temperature, entropy):
    """What forward.py computed before chunking: the whole [K, V] fp32 logits."""
    logits = torch.nn.functional.linear(h, weight, bias).float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    if entropy == "none":
        return logp, None
    src = logp_all if entropy == "grad" else logp_all.detach()
    return logp, -(src.exp() * src).sum(-1)


def leaves(
    k: int, h: int, v: int, *, bias: bool, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Hidden states [k, h], head weight [v, h], bias [v] or None."""
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(k, h, generator=g),
        torch.randn(v, h, generator=g) * 0.5,
        torch.randn(v, generator=g) if bias else None,
    )


def loss_of(logp, ent, k: int):
    """A loss with different weights per token, so every gradient path is exercised."""
    g = torch.Generator().manual_seed(1)
    loss = (logp * torch.randn(k, generator=g)).sum()
    if ent is not None and ent.requires_grad:
        loss = loss + (ent * torch.randn(k, generator=g)).sum()
    return loss


@pytest.mark.parametrize("entropy", MODES)
@pytest.mark.parametrize("chunk", [1, 5, 64])  # 5 does not divide K = 37; 64 > K (one chunk)
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_the_full_logits(entropy, chunk, bias) -> None:
    k, h, v = 37, 16, 50
    base = leaves(k, h, v, bias=bias)
    targets = torch.randint(0, v, (k,), generator=torch.Generator().manual_seed(2))
    results = []
    for fn in ("full", "chunked"):
        hidden, weight, b = (t.clone().requires_grad_() if t is not None else None for t in base)
        assert hidden is not None and weight is not None
        if fn == "full":
            logp, ent = full_reference(hidden, weight, b, targets, temperature=0.7, entropy=entropy)
        else:
            logp, ent = chunked_token_logprobs(
                hidden, weight, b, targets, temperature=0.7, entropy=entropy, chunk_tokens=chunk
            )
        loss_of(logp, ent, k).backward()
        results.append((logp, ent, [a.grad for a in (hidden, weight, b) if a is not None]))
    (lp_a, ent_a, grads_a), (lp_b, ent_b, grads_b) = results
    assert (lp_a - lp_b).abs().max() <= TOL
    if entropy == "none":
        assert ent_a is None and ent_b is None
    else:
        assert ent_a is not None and ent_b is not None and (ent_a - ent_b).abs().max() <= TOL
        assert ent_b.requires_grad == (entropy == "grad")
    for a, b in zip(grads_a, grads_b, strict=True):  # hidden states, head weight (and bias)
        assert (a - b).abs().max() <= TOL


@pytest.mark.parametrize("entropy", MODES)
def test_gradients_pass_gradcheck_in_float64(entropy) -> None:
    k, h, v = 7, 5, 9
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in ((k, h), (v, h), (v,))]
    targets = torch.randint(0, v, (k,), generator=g)

    def fn(hidden, weight, bias):
        logp, ent = ChunkedLogprobs.apply(hidden, weight, bias, targets, 1.3, entropy, 3)  # pyright: ignore[reportGeneralTypeIssues]
        return (logp, ent) if entropy == "grad" else logp

    assert torch.autograd.gradcheck(fn, tuple(args))


def test_detached_entropy_and_no_grad_build_no_graph() -> None:
    hidden, weight, _ = leaves(9, 4, 6, bias=False)
    hidden.requires_grad_()
    targets = torch.arange(9) % 6
    logp, ent = chunked_token_logprobs(hidden, weight, None, targets, entropy="detached", chunk_tokens=4)
    assert logp.requires_grad and ent is not None and not ent.requires_grad and ent.grad_fn is None
    with torch.no_grad():
        logp, ent = chunked_token_logprobs(hidden, weight, None, targets, entropy="grad", chunk_tokens=4)
    assert not logp.requires_grad and ent is not None and not ent.requires_grad
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_logprobs(hidden, weight, None, targets, chunk_tokens=0)


# -- through token_logprobs on real (tiny) models ----------------------------------------------
def untied_config() -> dict[str, Any]:
    return {**tiny_config(vocab_size=101, hidden_size=32, layers=2, heads=4, kv_heads=2), "tie_word_embeddings": False}


def forward_and_grads(model: nn.Module, mb, *, chunk: int, entropy: str, temperature: float = 0.7):
    model.zero_grad(set_to_none=True)
    logp, ent = token_logprobs(model, mb, temperature=temperature, entropy=entropy, chunk_tokens=chunk)  # pyright: ignore[reportArgumentType]
    loss = loss_of(logp.flatten(), ent.flatten() if ent is not None else None, logp.numel())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), (ent.detach() if ent is not None else None), grads


def assert_same(a, b) -> float:
    """Max difference over log-probs, entropies and every parameter's gradient (asserted <= TOL)."""
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = a, b
    worst = float((lp_a - lp_b).abs().max())
    if ent_a is not None or ent_b is not None:
        worst = max(worst, float((ent_a - ent_b).abs().max()))
    assert g_a.keys() == g_b.keys() and g_a
    for name in g_a:
        worst = max(worst, float((g_a[name] - g_b[name]).abs().max()))
    assert worst <= TOL, worst
    return worst


@pytest.mark.parametrize("entropy", MODES)
@pytest.mark.parametrize("head", ["tied", "untied"])
def test_token_logprobs_chunked_equals_full_end_to_end(tiny_model_dir: Path, entropy: str, head: str) -> None:
    cfg = ModelConfig(path=str(tiny_model_dir)) if head == "tied" else ModelConfig(config=untied_config())
    model = load_hf_model(cfg)
    assert _plain_head(model) is not None
    batch = make_batch(6)
    for mb in (pack_sequences(batch, range(6), attn_implementation="rlvr_packed"), pad_sequences(batch, [0, 1])):
        full = forward_and_grads(model, mb, chunk=0, entropy=entropy)
        for chunk in (3, 1000):  # several chunks, and one larger than K
            assert_same(forward_and_grads(model, mb, chunk=chunk, entropy=entropy), full)
        assert not getattr(model, UNCHUNKED_MARK, False)


def test_activation_checkpointing_and_temperature_one(tiny_model_dir: Path) -> None:
    trainer = TrainerConfig(strategy="none", activation_checkpointing="full")
    model = build_model(ModelConfig(path=str(tiny_model_dir)), trainer, device=CPU)
    mb = pack_sequences(make_batch(6), range(6), attn_implementation="rlvr_packed")
    full = forward_and_grads(model, mb, chunk=0, entropy="grad", temperature=1.0)
    assert_same(forward_and_grads(model, mb, chunk=4, entropy="grad", temperature=1.0), full)


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["q_proj", "lm_head"]])
def test_lora_gradients_equal_the_full_logits(tiny_model_dir: Path, targets: list[str]) -> None:
    """Adapters on the blocks: the head is plain and chunked; an adapted head takes the full path."""
    lora = LoraConfig(rank=4, alpha=8.0, target_modules=targets)
    trainer = TrainerConfig(strategy="none", lora=lora)
    model = build_model(ModelConfig(path=str(tiny_model_dir)), trainer, device=CPU)
    with torch.no_grad():  # B starts at zero: give the adapters something to pass a gradient through
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    assert (_plain_head(model) is None) == ("lm_head" in targets)
    mb = pack_sequences(make_batch(6), range(6), attn_implementation="rlvr_packed")
    full = forward_and_grads(model, mb, chunk=0, entropy="grad")
    got = forward_and_grads(model, mb, chunk=3, entropy="grad")
    assert_same(got, full)
    assert all("lora_" in name for name in got[2])


class ScaledLogits(nn.Module):
    """A model whose forward changes its head's output (as logit scales and soft-capping do)."""

    def __init__(self, inner: Any):
        super().__init__()
        self.inner = inner

    def get_output_embeddings(self) -> nn.Module:
        return self.inner.get_output_embeddings()

    def forward(self, **kwargs: Any) -> Any:
        out = self.inner(**kwargs)
        out.logits = out.logits * 2.0
        return out


def test_a_model_that_changes_the_head_output_falls_back_to_full_logits(tiny_model_dir: Path) -> None:
    model = ScaledLogits(load_hf_model(ModelConfig(path=str(tiny_model_dir))))
    mb = pack_sequences(make_batch(4), range(4), attn_implementation="rlvr_packed")
    full = forward_and_grads(model, mb, chunk=0, entropy="detached")
    assert_same(forward_and_grads(model, mb, chunk=3, entropy="detached"), full)
    assert getattr(model, UNCHUNKED_MARK) and _plain_head(model) is None


def test_soft_capped_logits_take_the_full_path(tiny_model_dir: Path) -> None:
    model: Any = load_hf_model(ModelConfig(path=str(tiny_model_dir)))
    model.config.final_logit_softcapping = 30.0
    assert _plain_head(model) is None


@pytest.mark.torchtitan
@pytest.mark.parametrize("entropy", MODES)
def test_torchtitan_chunked_equals_full(tiny_model_dir: Path, entropy: str) -> None:
    model = build_model(
        ModelConfig(path=str(tiny_model_dir), impl="torchtitan"), TrainerConfig(strategy="none"), device=CPU
    )
    assert _plain_head(model) is not None
    mb = pack_sequences(make_batch(6), range(6), attn_implementation="rlvr_packed")
    full = forward_and_grads(model, mb, chunk=0, entropy=entropy)
    assert_same(forward_and_grads(model, mb, chunk=5, entropy=entropy), full)
    assert not getattr(model, UNCHUNKED_MARK, False)
