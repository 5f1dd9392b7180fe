"""The trainer's log-probs, entropies and gradients against transformers' own eager forward, per family.

The reference runs each sequence alone, unpadded, through `attn_implementation="eager"`: the
family's own masks (sliding windows by layer), soft-capping, sinks and logit post-processing, as
transformers ships them. The trainer's side is what `rlvr launch` runs: `rlvr_packed` attention
over packed rows (sequence boundaries), shared prompts (a group's prompt once, branches under a
tree mask), padded micro-batches, chunked and full log-prob heads, LoRA. Sequences are 2-5x the
window. Tolerance 1e-5 (fp32); what was measured per family: docs/models.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr.recipe.families import FAMILIES
from rlvr.recipe.schema import LoraConfig, ModelConfig
from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.forward import token_logprobs
from rlvr.trainer.hf import load_hf_model
from rlvr.trainer.packing import make_micro_batches

from .configs import WINDOW

TOL = 1e-5
ATTENTION = "rlvr_packed"
pytestmark = pytest.mark.parametrize("family", sorted(FAMILIES))


def grouped(*, seed: int = 0) -> TrainBatch:
    """Two GRPO groups of three responses; prompts of 13 and 5 tokens, sequences up to 5x the window."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for plen in (13, 5):
        prompt = torch.randint(4, 90, (plen,), generator=g).tolist()
        for rlen in (4 * WINDOW, WINDOW // 2, 2 * WINDOW + 3):
            prompts.append(prompt)
            responses.append(torch.randint(4, 90, (rlen,), generator=g).tolist())
    return TrainBatch.from_sequences(prompts, responses, group_ids=[i // 3 for i in range(6)])


def reference(model: Any, batch: TrainBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sequence: log pi(response token) and the entropy at its position, one unpadded eager forward each."""
    logps, ents = [], []
    for i in range(len(batch)):
        ids = batch.tokens(i)
        p = int(batch.prompt_lens[i])
        logits = model(input_ids=ids[None], use_cache=False).logits[0, p - 1 : -1].float()
        logp_all = torch.log_softmax(logits, -1)
        logps.append(logp_all.gather(-1, ids[p:, None])[:, 0])
        ents.append(-(logp_all.exp() * logp_all).sum(-1))
    return logps, ents


def trainer_side(model: Any, batch: TrainBatch, *, packing: bool, share: bool, chunk: int, entropy: str = "detached"):
    """Per sequence, the same quantities through the trainer's micro-batches and forward."""
    logps: list[torch.Tensor | None] = [None] * len(batch)
    ents: list[torch.Tensor | None] = [None] * len(batch)
    mbs = make_micro_batches(batch, packing=packing, max_tokens=96, micro_batch_size=2,
                             attn_implementation=ATTENTION, share_prompts=share)  # fmt: skip
    assert not share or any(mb.segments is not None for mb in mbs), "no prompt was shared"
    for mb in mbs:
        logp, ent = token_logprobs(model, mb, entropy=entropy, chunk_tokens=chunk)  # type: ignore[arg-type]
        assert ent is not None
        for k, row in enumerate(mb.seq_index.tolist()):
            r = int(batch.response_lens[row])
            logps[row], ents[row] = logp[k, :r], ent[k, :r]
    return logps, ents


def load(folder: Path, attn: str) -> Any:
    return load_hf_model(ModelConfig(path=str(folder)), attn_implementation=attn).eval()


def worst(a: list[Any], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


LAYOUTS = {  # name: (packing, share_prompts, chunk_tokens)
    "packed": (True, False, 1024),
    "shared-prompts": (True, True, 1024),
    "full-logits": (True, True, 0),
    "padded": (False, False, 1024),
}


def test_logprobs_and_entropies_equal_transformers(family_dir: Path) -> None:
    """Every micro-batch layout and both log-prob heads, against one eager reference."""
    batch = grouped()
    model = load(family_dir, ATTENTION)
    with torch.no_grad():
        ref_logp, ref_ent = reference(load(family_dir, "eager"), batch)
        for name, (packing, share, chunk) in LAYOUTS.items():
            logp, ent = trainer_side(model, batch, packing=packing, share=share, chunk=chunk)
            assert worst(logp, ref_logp) < TOL, (name, worst(logp, ref_logp))
            assert worst(ent, ref_ent) < TOL, (name, worst(ent, ref_ent))


def test_lora_logprobs_equal_transformers(family_dir: Path) -> None:
    """peft's wrapped layers hand the segments and the window down; B is made non-zero so LoRA acts."""
    from rlvr.trainer.lora import apply_lora

    batch = grouped(seed=1)
    models = []
    for attn in ("eager", ATTENTION):
        model = apply_lora(load(family_dir, attn), LoraConfig(rank=4), seed=0)
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=g) * 0.1)
        models.append(model)
    with torch.no_grad():
        ref_logp, _ = reference(models[0], batch)
        logp, _ = trainer_side(models[1], batch, packing=True, share=True, chunk=1024)
    assert worst(logp, ref_logp) < TOL, worst(logp, ref_logp)


def test_gradient_equals_transformers(family_dir: Path) -> None:
    """d/dθ of a weighted sum of response log-probs and entropies: packed with shared prompts
    against the eager forward of each sequence alone."""
    batch = grouped(seed=2)
    weights = [
        torch.randn(int(r), generator=torch.Generator().manual_seed(i)) for i, r in enumerate(batch.response_lens)
    ]
    grads = []
    for side in ("reference", "trainer"):
        model = load(family_dir, "eager" if side == "reference" else ATTENTION).train()
        if side == "reference":
            logp, ent = reference(model, batch)
        else:
            logp, ent = trainer_side(model, batch, packing=True, share=True, chunk=1024, entropy="grad")
        loss = sum(((lp + 0.1 * e) * w).sum() for lp, e, w in zip(logp, ent, weights, strict=True))
        loss.backward()  # type: ignore[union-attr]
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    ref, got = grads
    assert ref.keys() == got.keys() and ref
    scale = max(float(g.abs().max()) for g in ref.values())
    errors = {n: float((got[n] - ref[n]).abs().max()) / scale for n in ref}
    assert max(errors.values()) < TOL, max(errors.items(), key=lambda kv: kv[1])
