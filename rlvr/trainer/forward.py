"""Forward passes that return per-response-token results in the `[b, T]` loss layout.

Only positions that predict a response token are projected (`logits_to_keep`), and log-softmax
runs in fp32 so pi/pi_old is not dominated by bf16 rounding. With `chunk_tokens > 0` the model's
LM head is swapped, for the one call and inside the model's own forward (so FSDP2 gathers the
head's weight and reduce-scatters its gradient as usual), for `rlvr.trainer.chunked_logprobs`, and
the `[K, V]` logits are never built. A change the model makes to the head's output (Gemma 2/3's
final soft-capping, Cohere's and Granite's logit scales) is switched off in the model for the call
and done inside the chunks instead; other models that change it keep the full path (docs/trainer.md,
"Log-probs a chunk of tokens at a time").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from rlvr.trainer.chunked_logprobs import EntropyMode, LogitTransform, chunked_token_logprobs
from rlvr.trainer.packing import MicroBatch, unpack

log = logging.getLogger(__name__)

# Config keys of transformers models that transform the logits after the LM head
# (Gemma 2/3 soft-capping, Cohere's logit_scale, Granite's logits_scaling).
POST_HEAD_KEYS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
UNCHUNKED_MARK = "_rlvr_full_logits"  # set on a model whose forward was seen to change the head's output

_Where = Literal["config", "module"]
_Op = Literal["softcap", "multiply", "divide"]
# transformers classes whose forward changes its LM head's output (`logits = self.lm_head(h)`, then
# the op, in the head's dtype), read from their modeling_*.py: the value's name, where the forward
# reads it at call time (`self.config.<name>` or `self.<name>`, set from the config at init), the op.
# A class found in a model's MRO (FSDP2 subclasses it) has it done by the chunks; a model with a
# POST_HEAD_KEYS value and none of these classes keeps the full logits.
POST_HEAD_CLASSES: dict[str, tuple[str, _Where, _Op]] = {
    "Gemma2ForCausalLM": ("final_logit_softcapping", "config", "softcap"),
    "Gemma3ForCausalLM": ("final_logit_softcapping", "config", "softcap"),
    "Gemma3nForCausalLM": ("final_logit_softcapping", "config", "softcap"),
    "VaultGemmaForCausalLM": ("final_logit_softcapping", "config", "softcap"),
    "GraniteForCausalLM": ("logits_scaling", "config", "divide"),
    "GraniteMoeForCausalLM": ("logits_scaling", "config", "divide"),
    "GraniteMoeSharedForCausalLM": ("logits_scaling", "config", "divide"),
    "GraniteMoeHybridForCausalLM": ("logits_scaling", "config", "divide"),
    "CohereForCausalLM": ("logit_scale", "module", "multiply"),
    "Cohere2ForCausalLM": ("logit_scale", "module", "multiply"),
}
_OFF: dict[_Op, float | None] = {"softcap": None, "multiply": 1.0, "divide": 1.0}  # the value that skips it


def token_logprobs(
    model: nn.Module,
    mb: MicroBatch,
    *,
    temperature: float = 1.0,
    entropy: EntropyMode = "detached",
    chunk_tokens: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token | prefix) and the policy entropy at each response position, [b, width].

    `temperature` divides the logits as the sampler did, so pi_old matches what generated
    the tokens. `"grad"` keeps the entropy's graph (entropy bonus in the loss), `"detached"`
    only reports it. `chunk_tokens`: response tokens per block of logits (0: all at once).
    """
    head = _plain_head(model) if chunk_tokens > 0 else None
    if head is not None:
        post = _post_head(model, head)
        got = _chunked(model, head, post, mb, temperature=temperature, entropy=entropy, chunk_tokens=chunk_tokens)
        if got is not None:
            return got
    return _full_logits(model, mb, temperature=temperature, entropy=entropy)


def _full_logits(
    model: nn.Module, mb: MicroBatch, *, temperature: float, entropy: EntropyMode
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The `[K, V]` logits at once: entropy costs one more pass over them."""
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


def _plain_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head if the chunked path can stand in for it: a plain linear layer (not a
    LoRA-wrapped one, not vocabulary-parallel: `TitanLM` answers None then) whose output the
    model's forward returns unchanged, or changed by a POST_HEAD_CLASSES op."""
    if getattr(model, UNCHUNKED_MARK, False):
        return None
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Linear):
        return None
    config = getattr(model, "config", None)
    configs = [config]
    text = getattr(config, "get_text_config", None)
    if callable(text):
        configs.append(text())
    if _post_head(model, head) is None and any(
        getattr(c, key, None) is not None for c in configs for key in POST_HEAD_KEYS
    ):
        return None
    return head


@dataclass(frozen=True)
class _PostHead:
    """The op a POST_HEAD_CLASSES model applies to its head's output: `transform` for the chunks
    (None: the value is the identity), `holder.<name>` the value its forward reads, `off` skips it."""

    transform: LogitTransform | None
    holder: Any
    name: str
    off: float | None

    @contextmanager
    def switched_off(self) -> Generator[None]:
        """The model's forward returns its head's output as is, for the block."""
        before = getattr(self.holder, self.name)
        setattr(self.holder, self.name, self.off)
        try:
            yield
        finally:
            setattr(self.holder, self.name, before)


def _post_head(model: nn.Module, head: nn.Module) -> _PostHead | None:
    """What the POST_HEAD_CLASSES module of `model` that owns `head` does to its output, else None."""
    for module in model.modules():
        spec = next(
            (POST_HEAD_CLASSES[c.__name__] for c in type(module).__mro__ if c.__name__ in POST_HEAD_CLASSES), None
        )
        get = getattr(module, "get_output_embeddings", None)
        if spec is None or not callable(get) or get() is not head:
            continue
        name, where, op = spec
        holder = getattr(module, "config", None) if where == "config" else module
        if not hasattr(holder, name):
            return None
        value = getattr(holder, name)
        if value is None or value == _OFF[op]:
            return _PostHead(None, holder, name, _OFF[op])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (op != "multiply" and value <= 0):
            return None  # a tensor, a zero cap or divisor: not an op the chunks do
        value = float(value)
        transform = LogitTransform(
            softcap=value if op == "softcap" else None,
            multiply=value if op == "multiply" else 1.0,
            divide=value if op == "divide" else 1.0,
        )
        return _PostHead(transform, holder, name, _OFF[op])
    return None


def _chunked(
    model: nn.Module,
    head: nn.Linear,
    post: _PostHead | None,
    mb: MicroBatch,
    *,
    temperature: float,
    entropy: EntropyMode,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The model's forward with `head` computing (log-prob, entropy) per kept position instead of
    logits, and `post`'s op switched off in the model and done in the chunks; None when the model
    changed what the head returned all the same (then it is marked for the full path)."""
    returned: list[torch.Tensor] = []

    def project(hidden: torch.Tensor) -> torch.Tensor:
        logp, ent = chunked_token_logprobs(
            hidden.reshape(-1, hidden.shape[-1]),
            head.weight,  # inside the forward: FSDP2 has gathered it (a plain tensor)
            head.bias,
            mb.targets,
            temperature=temperature,
            entropy=entropy,
            chunk_tokens=chunk_tokens,
            post=post.transform if post is not None else None,
        )
        # one tensor out, so the hooks FSDP2 puts on the forward's outputs see every gradient
        packed = logp[:, None] if ent is None else torch.stack([logp, ent], dim=-1)
        returned.append(packed)
        return packed

    with _forward_replaced(head, project), post.switched_off() if post is not None else nullcontext():
        out = model(**mb.model_kwargs(), logits_to_keep=mb.predict_mask, use_cache=False)
    if not returned or not _unchanged(out.logits, returned[-1]):
        log.warning("%s changes its LM head's output; using full logits", type(model).__name__)
        setattr(model, UNCHUNKED_MARK, True)
        return None
    packed = out.logits  # the model's own output: FSDP2's hooks are on it
    ent = None
    if entropy != "none":
        ent = packed[:, 1] if entropy == "grad" else packed[:, 1].detach()
        ent = unpack(ent, mb)
    return unpack(packed[:, 0], mb), ent


def _unchanged(logits: Any, packed: torch.Tensor) -> bool:
    """The model returned the head's output: that tensor, or the same values (a switched-off scale
    still runs as `x / 1.0`, `x * 1.0`, whose gradient is the identity too)."""
    if logits is packed:
        return True
    return (
        isinstance(logits, torch.Tensor)
        and logits.shape == packed.shape
        and logits.dtype == packed.dtype
        and bool(torch.equal(logits.detach(), packed.detach()))
    )


@contextmanager
def _forward_replaced(module: nn.Module, forward: Callable[..., Any]) -> Generator[None]:
    """`module.forward` is `forward` for the block: an instance attribute shadows the class's
    method, and `module(...)` still runs the module's hooks (FSDP2's gather) around it."""
    before = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if before is None:
            del module.forward
        else:
            module.forward = before


def token_values(model: nn.Module, mb: MicroBatch) -> torch.Tensor:
    """V(prefix) before each response token, [b, width], from a one-label token classifier."""
    out = model(**mb.model_kwargs(), use_cache=False)
    values = out.logits[..., 0].float()  # [R, N]
    return unpack(values[mb.predict_mask], mb)
