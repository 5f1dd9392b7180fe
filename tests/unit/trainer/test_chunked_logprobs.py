"""Chunked log-probs (rlvr.trainer.chunked_logprobs) against the full [K, V] logits: values and
gradients, on the bare op (with and without a soft-cap and logit scales) and through
`token_logprobs` on tiny models (tied and untied heads, LoRA, torchtitan, Gemma 2's soft-capping,
Granite's and Cohere's logit scales, a model that changes its head's output)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rlvr.recipe.schema import LoraConfig, ModelConfig, TrainerConfig
from rlvr.tiny import tiny_config
from rlvr.trainer import forward
from rlvr.trainer.chunked_logprobs import ChunkedLogprobs, LogitTransform, chunked_token_logprobs
from rlvr.trainer.forward import UNCHUNKED_MARK, _plain_head, _post_head, token_logprobs
from rlvr.trainer.hf import load_hf_model
from rlvr.trainer.model import build_model
from rlvr.trainer.packing import pack_sequences, pad_sequences

from ..families.configs import build_folder
from .conftest import make_batch

TOL = 1e-5
MODES = ["none", "detached", "grad"]
CPU = torch.device("cpu")
POSTS = {  # what a model does to its head's output
    "plain": None,
    "softcap": LogitTransform(softcap=2.0),  # Gemma 2/3 (it bites: these logits reach +-8)
    "multiply": LogitTransform(multiply=0.3),  # Cohere
    "divide": LogitTransform(divide=4.0),  # Granite
    "all": LogitTransform(multiply=1.5, divide=3.0, softcap=1.5),
}


def transformed(logits: torch.Tensor, post: LogitTransform | None) -> torch.Tensor:
    """The model's ops on its head's output, as transformers writes them (out of place, head dtype)."""
    if post is None:
        return logits
    if post.multiply != 1.0:
        logits = logits * post.multiply
    if post.divide != 1.0:
        logits = logits / post.divide
    if post.softcap is not None:
        logits = logits / post.softcap
        logits = torch.tanh(logits)
        logits = logits * post.softcap
    return logits


def full_reference(h, weight, bias, targets, *, temperature, entropy, post=None):
    """What forward.py computes on the full path: the whole [K, V] fp32 logits."""
    logits = transformed(torch.nn.functional.linear(h, weight, bias), post).float() / temperature
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


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("entropy", MODES)
@pytest.mark.parametrize("chunk", [1, 5, 64])  # 5 does not divide K = 37; 64 > K (one chunk)
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_the_full_logits(entropy, chunk, bias, post) -> None:
    k, h, v = 37, 16, 50
    base = leaves(k, h, v, bias=bias)
    targets = torch.randint(0, v, (k,), generator=torch.Generator().manual_seed(2))
    transform = POSTS[post]
    results = []
    for fn in ("full", "chunked"):
        hidden, weight, b = (t.clone().requires_grad_() if t is not None else None for t in base)
        assert hidden is not None and weight is not None
        if fn == "full":
            logp, ent = full_reference(hidden, weight, b, targets, temperature=0.7, entropy=entropy, post=transform)
        else:
            logp, ent = chunked_token_logprobs(
                hidden, weight, b, targets, temperature=0.7, entropy=entropy, chunk_tokens=chunk, post=transform
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


@pytest.mark.parametrize("post", ["plain", "softcap", "multiply", "divide", "all"])
@pytest.mark.parametrize("entropy", MODES)
def test_gradients_pass_gradcheck_in_float64(entropy, post) -> None:
    k, h, v = 7, 5, 9
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in ((k, h), (v, h), (v,))]
    targets = torch.randint(0, v, (k,), generator=g)
    transform = POSTS[post]
    if transform is not None and transform.softcap is not None:  # the cap bends these logits (|z| up to ~6)
        assert float((args[0] @ args[1].T + args[2]).detach().abs().max()) > 2 * transform.softcap

    def fn(hidden, weight, bias):
        logp, ent = ChunkedLogprobs.apply(hidden, weight, bias, targets, 1.3, entropy, 3, transform)  # pyright: ignore[reportGeneralTypeIssues]
        return (logp, ent) if entropy == "grad" else logp

    assert torch.autograd.gradcheck(fn, tuple(args))


def test_the_transform_runs_in_the_head_dtype_as_transformers_does() -> None:
    """bf16 head: the soft-cap (and scale) in bf16, as the model's forward does it, then fp32: the
    log-probs equal the full path's; doing the cap in fp32 instead differs by bf16 rounding."""
    hidden, weight, _ = (t.to(torch.bfloat16) if t is not None else None for t in leaves(33, 16, 50, bias=False))
    assert hidden is not None and weight is not None
    targets = torch.arange(33) % 50
    post = LogitTransform(multiply=1.5, divide=3.0, softcap=1.5)
    got, _ = chunked_token_logprobs(hidden, weight, None, targets, temperature=0.7, chunk_tokens=5, post=post)
    want, _ = full_reference(hidden, weight, None, targets, temperature=0.7, entropy="none", post=post)
    in_fp32, _ = full_reference(
        hidden.float(), weight.float(), None, targets, temperature=0.7, entropy="none", post=post
    )
    assert (got - want).abs().max() <= TOL
    assert (got - in_fp32).abs().max() > 10 * TOL


def test_a_transform_that_is_none_is_rejected_or_skipped() -> None:
    with pytest.raises(ValueError):
        LogitTransform(softcap=0.0)
    with pytest.raises(ValueError):
        LogitTransform(divide=0.0)
    hidden, weight, _ = leaves(9, 4, 6, bias=False)
    targets = torch.arange(9) % 6
    a, _ = chunked_token_logprobs(hidden, weight, None, targets, chunk_tokens=4, post=LogitTransform())
    b, _ = chunked_token_logprobs(hidden, weight, None, targets, chunk_tokens=4)
    assert torch.equal(a, b)


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


# -- models that change their head's output: the op switched off in the model, done in the chunks ---
COHERE: dict[str, Any] = {  # Cohere: `logits * self.logit_scale`, a module attribute set at init
    "model_type": "cohere", "vocab_size": 101, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "logit_scale": 0.25,
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}  # fmt: skip


@pytest.fixture(scope="module")
def family_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("post_head_families")


def post_head_model(family: str, root: Path) -> Any:
    """Tiny Gemma 2 (final_logit_softcapping 3.0), Granite (logits_scaling 4.0) or Cohere (logit_scale 0.25)."""
    if family == "cohere":
        return load_hf_model(ModelConfig(config=COHERE))
    return load_hf_model(ModelConfig(path=str(build_folder(family, root))))


EXPECTED = {
    "gemma2": LogitTransform(softcap=3.0),
    "granite": LogitTransform(divide=4.0),
    "cohere": LogitTransform(multiply=0.25),
}


@pytest.mark.parametrize("entropy", MODES)
@pytest.mark.parametrize("family", ["gemma2", "granite", "cohere"])
def test_soft_capped_and_scaled_logits_are_chunked(family_root: Path, family: str, entropy: str) -> None:
    """Gemma 2's soft-capping, Granite's and Cohere's logit scales: the chunks equal the full logits
    (log-probs, entropies, every gradient), the model's forward returned the chunks' [K, 1 or 2]
    output (never [K, V] logits), and its value is back afterwards."""
    model = post_head_model(family, family_root)
    head = _plain_head(model)
    assert head is not None
    post = _post_head(model, head)
    assert post is not None and post.transform == EXPECTED[family]
    before = getattr(post.holder, post.name)
    widths: list[int] = []
    model.register_forward_hook(lambda _m, _a, out: widths.append(out.logits.shape[-1]))
    batch = make_batch(6)
    for mb in (pack_sequences(batch, range(6), attn_implementation="rlvr_packed"), pad_sequences(batch, [0, 1])):
        widths.clear()
        full = forward_and_grads(model, mb, chunk=0, entropy=entropy)
        assert widths == [model.config.vocab_size]
        for chunk in (3, 1000):
            widths.clear()
            assert_same(forward_and_grads(model, mb, chunk=chunk, entropy=entropy), full)
            assert widths == [1 if entropy == "none" else 2]  # the packed (log-prob, entropy), not logits
            assert getattr(post.holder, post.name) == before
        assert not getattr(model, UNCHUNKED_MARK, False)


def test_the_value_is_restored_when_the_forward_fails(family_root: Path, monkeypatch) -> None:
    model = post_head_model("gemma2", family_root)

    def fail(*_a: Any, **_k: Any) -> Any:
        assert model.config.final_logit_softcapping is None  # switched off during the call
        raise RuntimeError("boom")

    monkeypatch.setattr(model.model, "forward", fail)
    with pytest.raises(RuntimeError, match="boom"):
        token_logprobs(model, pack_sequences(make_batch(2), range(2), attn_implementation="rlvr_packed"))
    assert model.config.final_logit_softcapping == 3.0


def test_a_cap_the_model_still_applies_falls_back_to_full_logits(family_root: Path, monkeypatch) -> None:
    """The safety net: if switching the op off does not reach the forward (a transformers version
    reading it elsewhere), the model caps the chunks' output; that is seen and the full path runs."""
    model = post_head_model("gemma2", family_root)
    monkeypatch.setattr(forward._PostHead, "switched_off", lambda _self: nullcontext())
    mb = pack_sequences(make_batch(4), range(4), attn_implementation="rlvr_packed")
    full = forward_and_grads(model, mb, chunk=0, entropy="detached")
    assert_same(forward_and_grads(model, mb, chunk=3, entropy="detached"), full)
    assert getattr(model, UNCHUNKED_MARK) and _plain_head(model) is None


def test_a_wrapper_that_changes_a_capped_output_falls_back(family_root: Path) -> None:
    model = ScaledLogits(post_head_model("gemma2", family_root))
    mb = pack_sequences(make_batch(4), range(4), attn_implementation="rlvr_packed")
    full = forward_and_grads(model, mb, chunk=0, entropy="grad")
    assert_same(forward_and_grads(model, mb, chunk=3, entropy="grad"), full)
    assert getattr(model, UNCHUNKED_MARK) and model.inner.config.final_logit_softcapping == 3.0


def test_an_unknown_model_with_a_post_head_key_takes_the_full_path(tiny_model_dir: Path) -> None:
    """A class outside POST_HEAD_CLASSES (here Qwen3) with a soft-cap in its config: full logits."""
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
