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

import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlvr.weight_arena import back_to_back_bytes

FAST_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def fast_path_supported(model: nn.Module) -> tuple[bool, str]:
    """Whether `StaticKVDecoder` can run `model` exactly, and if not, why."""
    config: Any = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAST_MODEL_TYPES:
        return False, f"model_type {model_type!r} is not one of {FAST_MODEL_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return False, f"hidden_act {config.hidden_act!r} is not silu"
    if getattr(config, "use_sliding_window", False) or (
        model_type == "mistral" and getattr(config, "sliding_window", None)
    ):
        return False, "sliding-window attention"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return False, f"layer types {sorted(set(layer_types))}"
    if getattr(config, "mlp_bias", False):
        return False, "MLP biases"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return False, "no model.layers / model.rotary_emb"
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


class _Layer:
    """The tensors of one decoder layer that the fast path reads (views of the HF parameters)."""

    def __init__(self, layer: Any, *, packed: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _Linear(*_fuse([attn.q_proj, attn.k_proj, attn.v_proj]), packed=packed)
        self.o = _Linear(attn.o_proj.weight, attn.o_proj.bias, packed=packed)
        self.gate_up = _Linear(_fuse([mlp.gate_proj, mlp.up_proj])[0], None, packed=packed)
        self.down = _Linear(mlp.down_proj.weight, None, packed=packed)
        self.ln1_w, self.ln1_eps = layer.input_layernorm.weight, _eps(layer.input_layernorm)
        self.ln2_w, self.ln2_eps = layer.post_attention_layernorm.weight, _eps(layer.post_attention_layernorm)
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

    def refresh(self, heads: int, kv_heads: int) -> None:
        """Rebuild the small tensors derived from weights (call after loading new weights)."""
        if self.q_norm is not None and self.k_norm is not None:
            # Q and K heads are normalised in one call: one weight row per head.
            head_dim = self.q_norm.weight.shape[0]
            self.qk_norm_w = torch.cat(
                [self.q_norm.weight.expand(heads, head_dim), self.k_norm.weight.expand(kv_heads, head_dim)]
            )


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
    """The fast path: a Llama-family forward over a preallocated, slot-indexed KV cache."""

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
        self.norm_w, self.norm_eps = inner.norm.weight, _eps(inner.norm)
        lm_head = model.get_output_embeddings()  # type: ignore[operator]
        self.lm_head = _Linear(lm_head.weight, getattr(lm_head, "bias", None), packed=packed_weights)
        self.layers = [_Layer(layer, packed=packed_weights) for layer in inner.layers]
        self._pack_lock = threading.Lock()
        self._pack_generation = 0
        self._packer: threading.Thread | None = None
        self._repack_pending = False
        self._retired: list[torch.Tensor] = []
        self.refresh(background=False)
        with torch.inference_mode():
            positions = torch.arange(max_len, device=self.device)[None]
            probe = torch.zeros(1, dtype=self.dtype, device=self.device)
            cos, sin = inner.rotary_emb(probe, positions)
        half = self.head_dim // 2
        sin = sin[0].to(self.dtype)
        signed_sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # rotate_half's sign folded in
        self.rope_table = torch.stack([cos[0].to(self.dtype), signed_sin], dim=1)  # [max_len, 2, head_dim]
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

    def _rope_at(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin at `pos`, [N, 1, hd] each (one gather for both)."""
        table = self.rope_table[pos]
        return table[:, 0:1], table[:, 1:2]

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
        qkv = layer.qkv(_rms(x, layer.ln1_w, layer.ln1_eps))
        rows = x.shape[0]
        qk = qkv[:, : self.q_dim + self.kv_dim].view(rows, self.heads + self.kv_heads, self.head_dim)
        v = qkv[:, self.q_dim + self.kv_dim :].view(rows, self.kv_heads, self.head_dim)
        if layer.qk_norm_w is not None:
            qk = F.rms_norm(qk, (self.head_dim,), None, layer.qk_norm_eps) * layer.qk_norm_w
        qk = _rope(qk, cos, sin)
        return qk[:, : self.heads], qk[:, self.heads :], v

    def _mlp_residual(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = layer.o.add_to(x, attn)
        gate, up = layer.gate_up(_rms(x, layer.ln2_w, layer.ln2_eps)).chunk(2, dim=-1)
        return layer.down.add_to(x, F.silu(gate) * up)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(_rms(x, self.norm_w, self.norm_eps))

    # -- engine calls -----------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, first_slot: int, prompts: list[list[int]]) -> torch.Tensor:
        """Run prompts into slots first_slot..; return each prompt's last-token logits [k, V].

        The projections and MLPs run on the prompts *packed* (no padding tokens: they are
        most of a prefill's FLOPs); only attention sees a padded [k, T] layout, gathered
        from the cache the keys were just written to. Rows are right-padded, so a plain
        causal mask is exact: a real token's keys are all real tokens of its own row, and
        what the padding queries see (stale cache) is never read back.
        """
        k_rows = len(prompts)
        lengths = [len(p) for p in prompts]
        span = max(lengths)
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=self.device)
        row = torch.repeat_interleave(torch.arange(k_rows), torch.tensor(lengths)).to(self.device)
        pos = torch.cat([torch.arange(n) for n in lengths]).to(self.device)
        slot = row + first_slot
        lens = torch.tensor(lengths, device=self.device)
        cos, sin = self._rope_at(pos)  # [N, 1, hd]
        rows = slice(first_slot, first_slot + k_rows)
        x = F.embedding(ids, self.embed)  # [N, D]
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)  # [N, H|KVH, hd]
            self.k_cache[li][slot, :, pos] = k
            self.v_cache[li][slot, :, pos] = v
            padded_q = q.new_zeros(k_rows, span, self.heads, self.head_dim)
            padded_q[row, pos] = q
            attn = F.scaled_dot_product_attention(
                padded_q.transpose(1, 2),
                self.k_cache[li, rows, :, :span],
                self.v_cache[li, rows, :, :span],
                is_causal=True,
                scale=layer.scaling,
                enable_gqa=self.group > 1,
            )  # [k, H, T, hd]
            x = self._mlp_residual(layer, x, attn.transpose(1, 2)[row, pos].reshape(-1, self.q_dim))
        last = torch.cumsum(lens, 0) - 1
        return self._logits(x[last])

    @torch.inference_mode()
    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Feed one token per live slot (slot i gets tokens[i] at positions[i]); return logits [B, V]."""
        batch = len(tokens)
        span = max(positions) + 1
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        slots = self._slot_index[:batch]
        keys = torch.arange(span, device=self.device)
        heads_rows = batch * self.kv_heads  # attention runs as one bmm over (slot, kv head) pairs
        visible = keys <= pos.repeat_interleave(self.kv_heads)[:, None, None]  # [B*KVH, 1, L]
        mask = torch.where(visible, 0.0, float("-inf")).to(self.dtype)
        cos, sin = self._rope_at(pos)  # [B, 1, hd]
        x = F.embedding(ids, self.embed)  # [B, D]
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)  # q [B, H, hd]; k, v [B, KVH, hd]
            k_cache, v_cache = self.k_cache[li], self.v_cache[li]
            k_cache[slots, :, pos] = k
            v_cache[slots, :, pos] = v
            # The GQA group rides on the query-length axis: q [B*KVH, G, hd] vs K [B*KVH, L, hd]
            # (slot and head dims of the cache merge without a copy). Spelled out rather than
            # SDPA: one query row per head is too little work for the flash kernel's tiling
            # (measured ~20% slower at decode shapes on CPU); baddbmm adds mask and scale in one op.
            scores = torch.baddbmm(
                mask,
                q.reshape(heads_rows, self.group, self.head_dim),
                k_cache[:batch, :, :span].reshape(heads_rows, span, self.head_dim).transpose(1, 2),
                alpha=layer.scaling,
            )
            attn = torch.bmm(scores.softmax(-1), v_cache[:batch, :, :span].reshape(heads_rows, span, self.head_dim))
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
        span = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), span, dtype=torch.long)
        attention = torch.zeros(len(seqs), span, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.tensor(seq)
            attention[i, : len(seq)] = 1
        positions = torch.arange(span)[None].expand(len(seqs), -1)
        out: Any = self.model(
            input_ids=ids.to(self.device),
            attention_mask=attention.to(self.device),
            position_ids=positions.to(self.device),
            use_cache=False,
        )
        last = torch.tensor([len(s) - 1 for s in seqs], device=self.device)
        return out.logits[torch.arange(len(seqs), device=self.device), last]

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
