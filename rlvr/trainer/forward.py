"""Forward passes that return per-response-token results in the `[b, T]` loss layout.

The vocabulary projection only runs on positions that predict a response token
(`logits_to_keep=predict_mask`), and log-softmax runs in fp32 whatever the compute dtype,
so the ratio pi/pi_old is not dominated by bf16 rounding.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from rlvr.trainer.packing import MicroBatch, unpack

EntropyMode = Literal["none", "detached", "grad"]


def token_logprobs(
    model: nn.Module, mb: MicroBatch, *, temperature: float = 1.0, entropy: EntropyMode = "detached"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token | prefix) and the policy entropy at each response position, [b, width].

    `temperature` divides the logits as the sampler did, so pi_old matches what generated
    the tokens. Entropy costs one more pass over [K, V]: `"grad"` keeps its graph (entropy
    bonus in the loss), `"detached"` only reports it.
    """
    out = model(**mb.model_kwargs(), logits_to_keep=mb.predict_mask, use_cache=False)
    logits = out.logits.reshape(-1, out.logits.shape[-1]).float()  # [K, V] (boolean keep flattens)
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, mb.targets[:, None]).squeeze(-1)
    ent = None
    if entropy != "none":
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            src = logp_all if entropy == "grad" else logp_all.detach()
            ent = unpack(-(src.exp() * src).sum(-1), mb)
    return unpack(logp, mb), ent


def token_values(model: nn.Module, mb: MicroBatch) -> torch.Tensor:
    """V(prefix) before each response token, [b, width], from a one-label token classifier."""
    out = model(**mb.model_kwargs(), use_cache=False)
    values = out.logits[..., 0].float()  # [R, N]
    return unpack(values[mb.predict_mask], mb)
