"""Model backends of the embedded engine: a fast static-KV decoder and a generic HF fallback.

Both hold sequences in *slots* 0..B-1 (the engine keeps live sequences packed at the front) and
expose the same three calls: `prefill` (new prompts into slots), `decode` (one token for every live
slot) and `move` (compaction when a sequence finishes).

`StaticKVDecoder` runs Llama-family decoders directly in torch from the HF module's own weights,
because on small batches the HF forward costs more in per-step Python and mask work than the
matmuls: a preallocated per-layer KV cache, fused QKV and gate/up projections that *are* the
weights (the HF parameters are views of them), and on CPU oneDNN-packed weight copies, rebuilt in
the background after a weight load. `RecomputeDecoder` runs any `AutoModelForCausalLM` by
recomputing the full forward each step: slow but exact. Why and how fast: docs/engines.md.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlvr.weight_arena import back_to_back_bytes

FAST_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
# Families whose layers follow Gemma's layout: embeddings scaled by sqrt(hidden), RMSNorms that
# multiply by (1 + weight) in fp32, and norms after attention and after the MLP as well as before.
GEMMA_MODEL_TYPES = ("gemma3_text",)

# The MLP activations the fast path runs, by config name, each the function HF's ACT2FN calls.
_ACTIVATIONS: dict[str, Any] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
}
# Rope types whose frequencies depend on the sequence's length, so that one table for every
# position up to max_len (what the fast path builds) differs from HF's on shorter sequences.
# LongRoPE switches to its long factors once a sequence passes original_max_position_embeddings
# (transformers' own cached generate then disagrees with its full forward). "dynamic" NTK is not
# here: it only rescales past max_position_embeddings, and the engine caps max_len there.
_LENGTH_DEPENDENT_ROPE = ("longrope",)


def _activation_name(config: Any) -> str:
    if config.model_type in GEMMA_MODEL_TYPES:
        return str(getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "gelu_pytorch_tanh"))
    return str(getattr(config, "hidden_act", "silu"))


def _layer_types(config: Any) -> list[str]:
    layers = int(config.num_hidden_layers)
    return list(getattr(config, "layer_types", None) or ["full_attention"] * layers)[:layers]


def layer_windows(config: Any) -> list[int | None]:
    """Each layer's sliding window as HF's masks apply it (None: full causal attention).

    A query at position i sees keys j with i - window < j <= i (`sliding_window_overlay` in
    transformers' masking_utils: `kv_idx > q_idx - sliding_window`), i.e. `window` keys including
    its own. Mistral windows every layer when `sliding_window` is set; the others window the
    layers that `layer_types` marks `sliding_attention` (Qwen2/Qwen3 derive those from
    `use_sliding_window` and `max_window_layers`, Gemma 3 from its local/global pattern).
    """
    window = getattr(config, "sliding_window", None)
    types = _layer_types(config)
    if config.model_type == "mistral":
        return [window] * len(types)
    return [window if t == "sliding_attention" else None for t in types]


def _rope_types(config: Any) -> set[str]:
    """The rope types of a config (`rope_parameters` flat or per layer type, legacy `rope_scaling`)."""
    found: set[str] = set()
    for params in (getattr(config, "rope_parameters", None), getattr(config, "rope_scaling", None)):
        if not isinstance(params, dict):
            continue
        nested = [v for v in params.values() if isinstance(v, dict)]
        for entry in nested or [params]:
            kind = entry.get("rope_type", entry.get("type"))
            if kind is not None:
                found.add(str(kind))
    return found


def fast_path_supported(model: nn.Module) -> tuple[bool, str]:
    """Whether `StaticKVDecoder` can run `model` exactly, and if not, why."""
    config: Any = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAST_MODEL_TYPES:
        return False, f"model_type {model_type!r} is not one of {FAST_MODEL_TYPES}"
    activation = _activation_name(config)
    if activation not in _ACTIVATIONS:
        return False, f"MLP activation {activation!r} is not one of {sorted(_ACTIVATIONS)}"
    layer_types = set(_layer_types(config))
    if layer_types - {"full_attention", "sliding_attention"}:
        return False, f"layer types {sorted(layer_types)}"
    windows = layer_windows(config)
    if any(w is not None and (not isinstance(w, int) or w < 1) for w in windows) or (
        "sliding_attention" in layer_types and getattr(config, "sliding_window", None) is None
    ):
        return False, f"sliding window {getattr(config, 'sliding_window', None)!r} is not a positive int"
    if getattr(config, "mlp_bias", False):
        return False, "MLP biases"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return False, "attention logit soft-capping"
    if getattr(config, "use_bidirectional_attention", False) or not getattr(config, "is_causal", True):
        return False, "bidirectional attention"
    length_dependent = _rope_types(config) & set(_LENGTH_DEPENDENT_ROPE)
    if length_dependent:
        return False, f"rope type {sorted(length_dependent)} depends on the sequence length"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return False, "no model.layers / model.rotary_emb"
    if model_type in GEMMA_MODEL_TYPES:
        norms = ("pre_feedforward_layernorm", "post_feedforward_layernorm", "post_attention_layernorm")
        if not all(hasattr(layer, n) for layer in inner.layers for n in norms):
            return False, f"a {model_type} layer without {norms}"
        if not hasattr(inner.embed_tokens, "embed_scale"):
            return False, "embeddings without embed_scale"
    return True, ""


def _onednn_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class _Linear:
    """`F.linear(x, weight, bias)` against a live weight tensor, through oneDNN's packed layout when enabled.

    The weight stays the source of truth (weight updates write into it); `packed` is a
    cache of it that the decoder drops and rebuilds (see `StaticKVDecoder.refresh`).
    """

    # oneDNN's fixed cost per call (~15 us) beats MKL only on enough work: measured inside the
    # tiny model's decode step, MKL still wins at 1M multiply-adds a call (rows x weights);
    # packed wins clearly from 4M (2.3x at [8x512]x[512x1024]).
    MIN_PACKED_MACS = 1 << 21
    MIN_PACKED_NUMEL = 4096  # smaller weights are never worth a packed copy

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool):
        self.weight, self.bias = weight, bias
        self.use_packed = packed and weight.numel() >= self.MIN_PACKED_NUMEL
        self.packed: torch.Tensor | None = None
        self.min_rows = -(-self.MIN_PACKED_MACS // weight.numel())  # rows from which packed wins

    def pack(self) -> torch.Tensor:
        with torch.inference_mode():
            return torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 32)

    def _plain(self, x: torch.Tensor) -> bool:
        """MKL rather than oneDNN for this call: no packed copy (yet), or too little work."""
        return self.packed is None or x.shape[0] < self.min_rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._plain(x):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`residual + self(x)`; on the plain path one `addmm` instead of a matmul and an add."""
        if self.bias is None and self._plain(x):
            return torch.addmm(residual, x, self.weight.t())
        return residual + self(x)


def _fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One [sum(rows), cols] weight (and bias) for several linears, sharing their storage.

    Weights that already lie back to back (the engine's weight arena keeps q/k/v and
    gate/up adjacent, as the state_dict orders them) are viewed as one tensor in place.
    Otherwise they are concatenated and each linear is re-pointed to a view of the result.
    Either way an in-place weight update reaches the fused tensor with no copy.
    """
    weights = [lin.weight.data for lin in linears]
    has_bias = [lin.bias is not None for lin in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("cannot fuse linears where only some have a bias")
    rows = sum(w.shape[0] for w in weights)
    cols = weights[0].shape[1]
    same_layout = all(w.dim() == 2 and w.dtype == weights[0].dtype and w.shape[1] == cols for w in weights)
    if not any(has_bias) and same_layout and back_to_back_bytes(weights) is not None:
        first = weights[0]
        fused = torch.empty(0, dtype=first.dtype, device=first.device)
        fused.set_(first.untyped_storage(), first.storage_offset(), (rows, cols), (cols, 1))
        return fused, None
    weight = torch.cat(weights, dim=0)
    bias = torch.cat([lin.bias.data for lin in linears], dim=0) if all(has_bias) else None  # type: ignore[union-attr]
    offset = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[offset : offset + n], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[offset : offset + n], requires_grad=False)
        offset += n
    return weight, bias


class _Norm:
    """One RMSNorm of the model, in its family's convention, against the live weight.

    Llama's: normalise in fp32, cast back, then `weight *` (HF's LlamaRMSNorm). Gemma's:
    normalise and multiply by `(1 + weight)` both in fp32, then cast (HF's Gemma3RMSNorm);
    `1 + weight` is derived from the weight, so `refresh` rebuilds it after a weight load.
    """

    def __init__(self, module: nn.Module, *, gemma: bool):
        self.module, self.gemma, self.eps = module, gemma, _eps(module)
        self.weight = torch.empty(0)
        self.refresh()

    def refresh(self) -> None:
        weight: Any = self.module.weight
        self.weight = 1.0 + weight.detach().float() if self.gemma else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gemma:
            return _rms(x, self.weight, self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight, self.eps).to(x.dtype)


class _Layer:
    """The tensors of one decoder layer that the fast path reads (views of the HF parameters)."""

    def __init__(self, layer: Any, *, packed: bool, gemma: bool, window: int | None, rope: int, activation: Any):
        attn, mlp = layer.self_attn, layer.mlp
        self.gemma, self.window, self.rope, self.act = gemma, window, rope, activation
        self.qkv = _Linear(*_fuse([attn.q_proj, attn.k_proj, attn.v_proj]), packed=packed)
        self.o = _Linear(attn.o_proj.weight, attn.o_proj.bias, packed=packed)
        self.gate_up = _Linear(_fuse([mlp.gate_proj, mlp.up_proj])[0], None, packed=packed)
        self.down = _Linear(mlp.down_proj.weight, None, packed=packed)
        self.ln1 = _Norm(layer.input_layernorm, gemma=gemma)
        # Llama: attention output added straight to the residual, post_attention_layernorm before
        # the MLP. Gemma: post_attention_layernorm on the attention output, pre_feedforward before
        # the MLP, post_feedforward on its output (four norms a layer).
        self.attn_out_norm: _Norm | None = None
        self.mlp_out_norm: _Norm | None = None
        if gemma:
            self.attn_out_norm = _Norm(layer.post_attention_layernorm, gemma=True)
            self.ln2 = _Norm(layer.pre_feedforward_layernorm, gemma=True)
            self.mlp_out_norm = _Norm(layer.post_feedforward_layernorm, gemma=True)
        else:
            self.ln2 = _Norm(layer.post_attention_layernorm, gemma=False)
        self.q_norm = getattr(attn, "q_norm", None)
        self.k_norm = getattr(attn, "k_norm", None)
        if (self.q_norm is None) != (self.k_norm is None):
            raise ValueError("q_norm without k_norm (or the reverse) is not a Llama-family layout")
        self.qk_norm_eps = 0.0 if self.q_norm is None else _eps(self.q_norm)
        if self.k_norm is not None and _eps(self.k_norm) != self.qk_norm_eps:
            raise ValueError("q_norm and k_norm epsilons differ")
        self.qk_norm_w: torch.Tensor | None = None
        self.scaling = float(getattr(attn, "scaling", attn.head_dim**-0.5))

    @property
    def linears(self) -> tuple[_Linear, ...]:
        return (self.qkv, self.o, self.gate_up, self.down)

    @property
    def norms(self) -> list[_Norm]:
        return [n for n in (self.ln1, self.attn_out_norm, self.ln2, self.mlp_out_norm) if n is not None]

    def refresh(self, heads: int, kv_heads: int) -> None:
        """Rebuild the small tensors derived from weights (call after loading new weights)."""
        for norm in self.norms:
            norm.refresh()
        if self.q_norm is not None and self.k_norm is not None:
            # Q and K heads are normalised in one call: one weight row per head (Gemma: 1 + weight, fp32).
            head_dim = self.q_norm.weight.shape[0]
            q_w, k_w = self.q_norm.weight.detach(), self.k_norm.weight.detach()
            if self.gemma:
                q_w, k_w = 1.0 + q_w.float(), 1.0 + k_w.float()
            self.qk_norm_w = torch.cat([q_w.expand(heads, head_dim), k_w.expand(kv_heads, head_dim)])


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=device)


def _lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A CPU tensor of zeros backed by an anonymous mapping: the kernel hands out zero pages on
    first write, so untouched positions cost no RAM (`torch.zeros` writes, hence commits, every
    page at once). Unmapped when the last view of it goes."""
    import math
    import mmap

    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)


def _eps(norm: nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as the HF RMSNorm (fp32 statistics, scale after casting back).
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's `x * cos + rotate_half(x) * sin`, with rotate_half's sign folded into the sin table."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


class StaticKVDecoder:
    """The fast path: a Llama-family (or Gemma 3) forward over a preallocated, slot-indexed KV cache.

    Layers with a sliding window (Gemma 3's local layers, Mistral's and Qwen2/Qwen3's
    `use_sliding_window`) keep every position in the cache like the others; the window is a mask
    (and, in decode, a narrower span of keys), so `move` and prefill need no ring buffer.
    """

    def __init__(self, model: nn.Module, *, max_slots: int, max_len: int, packed_weights: bool | None = None):
        """`packed_weights`: oneDNN packed projections (None: wherever oneDNN can run them, i.e. CPU)."""
        ok, why = fast_path_supported(model)
        if not ok:
            raise ValueError(f"fast path unsupported: {why}")
        config: Any = model.config
        inner: Any = model.model
        self.model = model
        self.max_slots = max_slots
        self.max_len = max_len
        self.gemma = config.model_type in GEMMA_MODEL_TYPES
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.group = self.heads // self.kv_heads
        self.q_dim = self.heads * self.head_dim
        self.kv_dim = self.kv_heads * self.head_dim
        weight = inner.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        if packed_weights is None:
            packed_weights = _onednn_available(self.device, self.dtype)
        self.packed_weights = packed_weights
        self.embed = weight
        # Gemma scales the embeddings by sqrt(hidden_size), rounded to the weights' dtype first
        # (Gemma3TextScaledWordEmbedding: `embedding * embed_scale.to(weight.dtype)`).
        self.embed_scale: torch.Tensor | None = None
        self.norm = _Norm(inner.norm, gemma=self.gemma)
        self.final_softcap: float | None = getattr(config, "final_logit_softcapping", None)
        lm_head = model.get_output_embeddings()  # type: ignore[operator]
        self.lm_head = _Linear(lm_head.weight, getattr(lm_head, "bias", None), packed=packed_weights)
        # One rope table per layer type where the rotary module takes one (Gemma 3: local layers
        # use rope_local_base_freq, global layers rope_theta and its scaling); else one for all.
        rotary = inner.rotary_emb
        layer_types = _layer_types(config)
        per_type = "layer_type" in inspect.signature(rotary.forward).parameters
        rope_keys: list[str | None] = list(dict.fromkeys(layer_types)) if per_type else [None]
        activation = _ACTIVATIONS[_activation_name(config)]
        windows = layer_windows(config)
        self.layers = [
            _Layer(
                layer,
                packed=packed_weights,
                gemma=self.gemma,
                window=windows[i],
                rope=rope_keys.index(layer_types[i]) if per_type else 0,
                activation=activation,
            )
            for i, layer in enumerate(inner.layers)
        ]
        self._pack_lock = threading.Lock()
        self._pack_generation = 0
        self._packer: threading.Thread | None = None
        self._repack_pending = False
        self._retired: list[torch.Tensor] = []
        self.refresh(background=False)
        half = self.head_dim // 2
        tables = []
        with torch.inference_mode():
            positions = torch.arange(max_len, device=self.device)[None]
            probe = torch.zeros(1, dtype=self.dtype, device=self.device)
            for key in rope_keys:
                cos, sin = rotary(probe, positions) if key is None else rotary(probe, positions, key)
                sin = sin[0].to(self.dtype)
                signed_sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # rotate_half's sign folded in
                tables.append(torch.stack([cos[0].to(self.dtype), signed_sin], dim=1))  # [max_len, 2, head_dim]
        self.rope_table = torch.stack(tables)  # [rope kinds, max_len, 2, head_dim]
        self.k_cache = self.v_cache = torch.empty(0, dtype=self.dtype, device=self.device)
        self.allocate_kv()
        self._slot_index = torch.arange(max_slots, device=self.device)

    # -- the KV cache -----------------------------------------------------------------------

    @property
    def kv_shape(self) -> tuple[int, ...]:
        return (len(self.layers), self.max_slots, self.kv_heads, self.max_len, self.head_dim)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes the K and V caches hold now (0 while released)."""
        return sum(t.numel() * t.element_size() for t in (self.k_cache, self.v_cache))

    @property
    def packed_bytes(self) -> int:
        """Bytes of the oneDNN packed weight copies held now (a cache; see the module docstring)."""
        return sum(lin.packed.numel() * lin.packed.element_size() for lin in self._linears() if lin.packed is not None)

    def allocate_kv(self) -> None:
        """(Re)allocate the K and V caches, `max_slots x max_len` tokens each (no-op if held).

        Zeros, not `empty`: the padded prefill reads stale positions it then masks, and
        uninitialised memory may hold NaNs, which a mask does not cancel (0 * NaN). On CPU
        the zeros are an anonymous mapping (`_lazy_zeros`), so the cache takes RAM only for
        the positions sequences have written, not for every slot at full length."""
        if self.k_cache.numel():
            return
        make = _lazy_zeros if self.device.type == "cpu" else _zeros
        self.k_cache = make(self.kv_shape, self.dtype, self.device)
        self.v_cache = make(self.kv_shape, self.dtype, self.device)

    def release_kv(self) -> int:
        """Free the K and V caches (every cached sequence is lost); returns the bytes freed."""
        freed = self.kv_cache_bytes
        self.k_cache = self.v_cache = torch.empty(0, dtype=self.dtype, device=self.device)
        return freed

    # -- shared per-layer pieces ------------------------------------------------------------

    def _rope_at(self, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """cos and signed sin at `pos`, [N, 1, hd] each, for each rope table (one gather for all)."""
        return [(table[:, 0:1], table[:, 1:2]) for table in self.rope_table[:, pos]]

    def invalidate(self) -> None:
        """Drop every packed weight copy (the engine calls it before writing new weights).

        The copies are freed by the next rebuild's thread, not here: unmapping a few
        hundred MB costs milliseconds on the weight-sync path.
        """
        with self._pack_lock:
            self._pack_generation += 1
            self._repack_pending = False
            for linear in self._linears():
                if linear.packed is not None:
                    self._retired.append(linear.packed)
                    linear.packed = None

    def refresh(self, *, background: bool = True, repack: bool = True, start: bool = True) -> None:
        """Rebuild weight-derived tensors; the engine calls it after every weight load.

        The packed copies are rebuilt on a background thread (`background=False`: here);
        a newer `invalidate`/`refresh` makes an unfinished rebuild discard its work.
        `repack=False` (a bucket that is not a sync's last) leaves them dropped: the plain
        path is exact, and repacking before the rest of the weights arrive is wasted work.
        `start=False` only marks the rebuild pending: a paused engine starts it when it
        resumes (`start_repack`), so the rebuild never competes with the rest of a sync.
        """
        for layer in self.layers:
            layer.refresh(self.heads, self.kv_heads)
        self.norm.refresh()
        if self.gemma:
            embed_scale: Any = self.model.model.embed_tokens.embed_scale  # type: ignore[union-attr]
            self.embed_scale = embed_scale.detach().to(device=self.device, dtype=self.dtype)
        self.invalidate()
        if not (self.packed_weights and repack):
            return
        if not background:
            self._repack(self._pack_generation)
            return
        with self._pack_lock:
            self._repack_pending = True
        if start:
            self.start_repack()

    def start_repack(self) -> None:
        """Start the pending rebuild of the packed copies on a background thread, if any."""
        with self._pack_lock:
            if not self._repack_pending:
                return
            self._repack_pending = False
            generation = self._pack_generation
        self._packer = threading.Thread(target=self._repack, args=(generation,), name="rlvr-repack", daemon=True)
        self._packer.start()

    def wait_packed(self, timeout: float | None = None) -> None:
        """Start any pending rebuild and block until it is done (tests and benchmarks)."""
        self.start_repack()
        if self._packer is not None:
            self._packer.join(timeout)

    def close(self) -> None:
        """Stop a rebuild of the packed copies and wait for it (it quits at its next weight).

        Why: the packer is a daemon thread, and one still inside a oneDNN reorder (GIL released)
        when the interpreter exits is killed by an unwind through C++ frames: "terminate called
        without an active exception", exit status 134. A real model's rebuild takes seconds (2.2 s
        for SmolLM2-135M's 121 projections), so a process that closed its engine within seconds of a
        weight load and exited aborted (a pytest run did); a toy model's rebuild ends at once."""
        with self._pack_lock:
            self._pack_generation += 1
            self._repack_pending = False
        if self._packer is not None:
            self._packer.join()

    def _linears(self) -> list[_Linear]:
        return [self.lm_head, *(linear for layer in self.layers for linear in layer.linears)]

    def _repack(self, generation: int) -> None:
        with self._pack_lock:
            retired, self._retired = self._retired, []
        del retired  # freed here, off the weight-sync path
        for linear in self._linears():
            if not linear.use_packed:
                continue
            if generation != self._pack_generation:
                return
            packed = linear.pack()
            with self._pack_lock:
                if generation != self._pack_generation:
                    return  # weights changed again; a newer rebuild owns the copies
                linear.packed = packed

    def _qkv(
        self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, D] -> q [N, H, hd], k/v [N, KVH, hd], with q/k norms and rope applied to q and k at once."""
        qkv = layer.qkv(layer.ln1(x))
        rows = x.shape[0]
        qk = qkv[:, : self.q_dim + self.kv_dim].view(rows, self.heads + self.kv_heads, self.head_dim)
        v = qkv[:, self.q_dim + self.kv_dim :].view(rows, self.kv_heads, self.head_dim)
        if layer.qk_norm_w is not None and layer.gemma:
            qk = (F.rms_norm(qk.float(), (self.head_dim,), None, layer.qk_norm_eps) * layer.qk_norm_w).to(qk.dtype)
        elif layer.qk_norm_w is not None:
            qk = F.rms_norm(qk, (self.head_dim,), None, layer.qk_norm_eps) * layer.qk_norm_w
        qk = _rope(qk, cos, sin)
        return qk[:, : self.heads], qk[:, self.heads :], v

    def _mlp_residual(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        norm = layer.attn_out_norm
        x = layer.o.add_to(x, attn) if norm is None else x + norm(layer.o(attn))
        gate, up = layer.gate_up(layer.ln2(x)).chunk(2, dim=-1)
        if layer.mlp_out_norm is None:
            return layer.down.add_to(x, layer.act(gate) * up)
        return x + layer.mlp_out_norm(layer.down(layer.act(gate) * up))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(ids, self.embed)
        return x if self.embed_scale is None else x * self.embed_scale

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(x))
        if self.final_softcap is not None:  # Gemma's tanh soft-capping, as HF's forward applies it
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    # -- engine calls -----------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, first_slot: int, prompts: list[list[int]]) -> torch.Tensor:
        """Run prompts into slots first_slot..; return each prompt's last-token logits [k, V].

        The projections and MLPs run on the prompts *packed* (no padding tokens: they are
        most of a prefill's FLOPs); only attention sees a padded [k, T] layout, gathered
        from the cache the keys were just written to. Rows are right-padded, so a plain
        causal mask is exact: a real token's keys are all real tokens of its own row, and
        what the padding queries see (stale cache) is never read back. A sliding-window layer
        narrower than the longest prompt adds the window to that mask (a band: i - window < j <= i).
        """
        k_rows = len(prompts)
        lengths = [len(p) for p in prompts]
        span = max(lengths)
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=self.device)
        row = torch.repeat_interleave(torch.arange(k_rows), torch.tensor(lengths)).to(self.device)
        pos = torch.cat([torch.arange(n) for n in lengths]).to(self.device)
        slot = row + first_slot
        lens = torch.tensor(lengths, device=self.device)
        ropes = self._rope_at(pos)  # per rope table: cos, sin [N, 1, hd]
        masks = self._prefill_masks(span)
        rows = slice(first_slot, first_slot + k_rows)
        x = self._embed(ids)  # [N, D]
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, *ropes[layer.rope])  # [N, H|KVH, hd]
            self.k_cache[li][slot, :, pos] = k
            self.v_cache[li][slot, :, pos] = v
            padded_q = q.new_zeros(k_rows, span, self.heads, self.head_dim)
            padded_q[row, pos] = q
            mask = masks[layer.window]
            attn = F.scaled_dot_product_attention(
                padded_q.transpose(1, 2),
                self.k_cache[li, rows, :, :span],
                self.v_cache[li, rows, :, :span],
                attn_mask=mask,
                is_causal=mask is None,
                scale=layer.scaling,
                enable_gqa=self.group > 1,
            )  # [k, H, T, hd]
            x = self._mlp_residual(layer, x, attn.transpose(1, 2)[row, pos].reshape(-1, self.q_dim))
        last = torch.cumsum(lens, 0) - 1
        return self._logits(x[last])

    def _prefill_masks(self, span: int) -> dict[int | None, torch.Tensor | None]:
        """Per window, the [T, T] boolean mask of a prefill over `span` positions (None: plain causal)."""
        masks: dict[int | None, torch.Tensor | None] = {None: None}
        for window in {layer.window for layer in self.layers if layer.window is not None}:
            if window >= span:
                masks[window] = None  # the window reaches back past position 0: causal is the same
                continue
            i = torch.arange(span, device=self.device)[:, None]
            j = torch.arange(span, device=self.device)[None]
            masks[window] = (j <= i) & (j > i - window)
        return masks

    def _decode_masks(self, positions: list[int], pos: torch.Tensor) -> dict[int | None, tuple[int, torch.Tensor]]:
        """Per window, the first key position a decode step reads and the additive mask from it.

        [B*KVH, 1, L] rows: row (slot, kv head) sees keys j with j <= pos (and, windowed,
        j > pos - window). A windowed layer reads keys from the earliest any slot still sees,
        not from 0: past the window, its attention costs the window, not the sequence.
        """
        span = max(positions) + 1
        query = pos.repeat_interleave(self.kv_heads)[:, None, None]  # [B*KVH, 1, 1]
        masks: dict[int | None, tuple[int, torch.Tensor]] = {}
        for window in {layer.window for layer in self.layers} | {None}:
            first = 0 if window is None else max(0, min(positions) - window + 1)
            keys = torch.arange(first, span, device=self.device)
            visible = keys <= query
            if window is not None and max(positions) - window + 1 > 0:
                visible = visible & (keys > query - window)
            masks[window] = (first, torch.where(visible, 0.0, float("-inf")).to(self.dtype))
        return masks

    @torch.inference_mode()
    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Feed one token per live slot (slot i gets tokens[i] at positions[i]); return logits [B, V]."""
        batch = len(tokens)
        span = max(positions) + 1
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        slots = self._slot_index[:batch]
        heads_rows = batch * self.kv_heads  # attention runs as one bmm over (slot, kv head) pairs
        masks = self._decode_masks(positions, pos)
        ropes = self._rope_at(pos)  # per rope table: cos, sin [B, 1, hd]
        x = self._embed(ids)  # [B, D]
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, *ropes[layer.rope])  # q [B, H, hd]; k, v [B, KVH, hd]
            k_cache, v_cache = self.k_cache[li], self.v_cache[li]
            k_cache[slots, :, pos] = k
            v_cache[slots, :, pos] = v
            first, mask = masks[layer.window]
            keys = span - first
            # The GQA group rides on the query-length axis: q [B*KVH, G, hd] vs K [B*KVH, L, hd]
            # (slot and head dims of the cache merge without a copy). Spelled out rather than
            # SDPA: one query row per head is too little work for the flash kernel's tiling
            # (measured ~20% slower at decode shapes on CPU); baddbmm adds mask and scale in one op.
            scores = torch.baddbmm(
                mask,
                q.reshape(heads_rows, self.group, self.head_dim),
                k_cache[:batch, :, first:span].reshape(heads_rows, keys, self.head_dim).transpose(1, 2),
                alpha=layer.scaling,
            )
            values = v_cache[:batch, :, first:span].reshape(heads_rows, keys, self.head_dim)
            attn = torch.bmm(scores.softmax(-1), values)
            x = self._mlp_residual(layer, x, attn.reshape(batch, self.q_dim))
        return self._logits(x)

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy slot src's first `length` cached positions into slot dst (compaction or n-way fan-out)."""
        self.k_cache[:, dst, :, :length] = self.k_cache[:, src, :, :length]
        self.v_cache[:, dst, :, :length] = self.v_cache[:, src, :, :length]


class RecomputeDecoder:
    """Any HF causal LM: each step is a full forward of every live sequence (exact, no cache)."""

    def __init__(self, model: nn.Module, *, max_slots: int, max_len: int):
        self.model = model
        self.max_slots = max_slots
        self.max_len = max_len
        param = next(model.parameters())
        self.device = param.device
        self.slots: list[list[int]] = [[] for _ in range(max_slots)]

    @torch.inference_mode()
    def _forward_last(self, seqs: list[list[int]]) -> torch.Tensor:
        """Each sequence's next-token logits [len(seqs), V]: one right-padded forward of all of them.

        Only each row's last position reaches the LM head: a pre-hook on the output embedding
        gathers those hidden states ([B, 1, D]) before the projection, so the step never builds
        logits for every position (at Gemma 3's 262k vocabulary, 16 rows x 80 tokens would be
        1.3 GB a step). What the model does after its head (Gemma's final-logit soft-capping, a
        logit scale) is elementwise and still applies. A model whose head sees something else
        than [B, T, D] hidden states is left alone and its logits gathered after.
        """
        rows = len(seqs)
        span = max(len(s) for s in seqs)
        ids = torch.zeros(rows, span, dtype=torch.long)
        attention = torch.zeros(rows, span, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.tensor(seq)
            attention[i, : len(seq)] = 1
        positions = torch.arange(span)[None].expand(rows, -1)
        row_index = torch.arange(rows, device=self.device)
        last = torch.tensor([len(s) - 1 for s in seqs], device=self.device)
        gathered: list[bool] = []

        def keep_last(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            hidden = args[0] if args else None
            if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or tuple(hidden.shape[:2]) != (rows, span):
                return None
            gathered.append(True)
            return (hidden[row_index, last][:, None], *args[1:])

        get_head = getattr(self.model, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        hook = head.register_forward_pre_hook(keep_last) if isinstance(head, nn.Module) else None
        try:
            out: Any = self.model(
                input_ids=ids.to(self.device),
                attention_mask=attention.to(self.device),
                position_ids=positions.to(self.device),
                use_cache=False,
            )
        finally:
            if hook is not None:
                hook.remove()
        logits = out.logits
        if gathered and tuple(logits.shape[:2]) == (rows, 1):
            return logits[:, 0]
        return logits[row_index, last]

    kv_cache_bytes = 0  # no cache: each step recomputes every sequence
    packed_bytes = 0

    def allocate_kv(self) -> None:
        """No cache to allocate."""

    def release_kv(self) -> int:
        """No cache to free."""
        return 0

    def invalidate(self) -> None:
        """Nothing derived from weights is cached here."""

    def refresh(self, *, repack: bool = True, start: bool = True) -> None:
        """Nothing derived from weights is cached here."""

    def start_repack(self) -> None:
        """Nothing to rebuild."""

    def wait_packed(self, timeout: float | None = None) -> None:
        """Nothing to wait for."""

    def close(self) -> None:
        """No thread to stop."""

    def prefill(self, first_slot: int, prompts: list[list[int]]) -> torch.Tensor:
        for i, prompt in enumerate(prompts):
            self.slots[first_slot + i] = list(prompt)
        return self._forward_last(prompts)

    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        seqs = []
        for i, (token, position) in enumerate(zip(tokens, positions, strict=True)):
            seq = self.slots[i][:position]
            seq.append(token)
            self.slots[i] = seq
            seqs.append(seq)
        return self._forward_last(seqs)

    def move(self, src: int, dst: int, length: int) -> None:
        self.slots[dst] = list(self.slots[src][:length])
