"""torchtitan's Qwen3 / Llama3 decoders as the trainer's model (`model.impl = "torchtitan"`).

What this module owns, so the rest of the trainer stays implementation-agnostic: model args from
the HF config.json (`titan_config`; q/k/v kept separate so they map 1:1 onto HF names); weights in
and out through torchtitan's own state-dict adapters (`from_hf` into the shards; `hf_sources` pairs
every HF name with its sharded tensor and layout change, so sync and export gather HF tensors one at
a time); tensor parallel, FSDP2, activation checkpointing and `torch.compile` through torchtitan's
parallelize functions; and `PackedSDPA`, causal sdpa on each packed sequence's slice, on any device.
`TitanLM` answers the transformers calling convention the losses use. On CPU, four fixes for
torchtitan 0.3.0 are applied (docs/trainer.md, "How it is wired").
"""

# pyright: reportMissingTypeStubs=false
# (torchtitan ships no stubs or py.typed; pyright reads its sources, and the calls whose types it
# leaves unknown go through the Protocols below)

from __future__ import annotations

import functools
import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

import torch
import torch.nn.functional as F
from torch import nn

from rlvr.recipe.schema import ModelConfig, TrainerConfig
from rlvr.trainer import dist as d
from rlvr.trainer.attention import PACKED_ATTENTION
from rlvr.trainer.hf import load_hf_config, load_hf_model
from rlvr.trainer.typed_torch import int_list

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import ValueType
    from torchtitan.config import CompileConfig
    from torchtitan.models.common.attention import GQAttention, VarlenMetadata
    from torchtitan.models.common.feed_forward import FeedForward
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.common.rope import RoPE
    from torchtitan.protocols.module import Module
    from transformers import PreTrainedConfig

# torchtitan's parameter initialisers: parameter name -> init function
_Init = dict[str, Callable[[torch.Tensor], torch.Tensor]]


class _ConfigUtils(Protocol):
    """torchtitan's block config builders as rlvr calls them (torchtitan annotates the
    initialisers with a bare `Callable`)."""

    def make_gqa_config(
        self,
        *,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        wqkv_param_init: _Init,
        wo_param_init: _Init,
        inner_attention: Module.Config,
        fuse_qkv: bool,
        rope: RoPE.Config,
        qk_norm: RMSNorm.Config | None,
    ) -> GQAttention.Config: ...

    def make_ffn_config(
        self, *, dim: int, hidden_dim: int, w1_param_init: _Init, w2w3_param_init: _Init
    ) -> FeedForward.Config: ...


class _StateDictAdapter(Protocol):
    """torchtitan's state-dict adapter: its parameter names <-> transformers' names."""

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, ValueType]: ...


class _SafetensorsTorch(Protocol):
    """`safetensors.torch` as rlvr calls it (its path parameter leaves a type unknown)."""

    def load_file(self, filename: str) -> dict[str, torch.Tensor]: ...


class _CheckpointingConfig(Protocol):
    """torchtitan's activation-checkpointing config (`FullAC.Config`, `SelectiveAC.Config`)."""

    def build(self, *, dump_folder: str) -> _Checkpointing: ...


class _Checkpointing(Protocol):
    def apply(self, model: nn.Module, /) -> None: ...


class _TrainingSettings(TypedDict):
    ac_config: _CheckpointingConfig | None
    compile_config: CompileConfig


FAMILIES = {"qwen3": "qwen3", "llama": "llama3"}
_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"
_KERNEL_NAMES = (
    "copy_full_counts_to_peers_kernel",
    "copy_rows_to_peers_kernel",
    "expand_topk_grad_kernel",
    "fill_combine_metadata_kernel",
    "fill_dispatch_metadata_kernel",
    "invert_flat_indices_kernel",
    "reduce_topk_slots_kernel",
    "topk_scores_grad_kernel",
)


def prepare_cpu() -> None:
    """The import-time CPU fixes (idempotent): a stub for the triton MoE kernels torchtitan
    imports eagerly (dense models never call them; `triton` itself is never faked), and
    "cpu" as torchtitan's device type for its device meshes."""
    if _KERNELS not in sys.modules:
        stub = types.ModuleType(_KERNELS)
        stub.__file__ = __file__  # inspect (torch.library) reads it
        for name in _KERNEL_NAMES:
            setattr(stub, name, _no_triton(name))
        sys.modules[_KERNELS] = stub
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.tools.utils as tool_utils

    parallel_dims.device_type = "cpu"
    tool_utils.device_type = "cpu"


def _no_triton(name: str) -> Callable[..., None]:
    def missing(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{name} is a triton kernel (expert parallelism); it does not run on CPU")

    return missing


# -- model args from the HF config ----------------------------------------------------------
def family_of(hf_config: PreTrainedConfig) -> str:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(
            f"model.impl = 'torchtitan' supports model_type {sorted(FAMILIES)}; this model is {model_type!r} "
            "(use model.impl = 'hf')"
        )
    return FAMILIES[model_type]


def _rope(hf_config: PreTrainedConfig, family: str, head_dim: int) -> RoPE.Config:
    from torchtitan.models.common import ComplexRoPE, CosSinRoPE

    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    theta = float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
    kind = params.get("rope_type", "default")
    max_len = int(hf_config.max_position_embeddings)
    if family == "qwen3":
        if kind != "default":
            raise ValueError(f"torchtitan's Qwen3 has no {kind!r} rope scaling; use model.impl = 'hf'")
        return CosSinRoPE.Config(dim=head_dim, max_seq_len=max_len, theta=theta)
    if kind == "default":
        return ComplexRoPE.Config(dim=head_dim, max_seq_len=max_len, theta=theta)
    if kind != "llama3":
        raise ValueError(f"torchtitan's Llama3 has no {kind!r} rope scaling; use model.impl = 'hf'")
    return ComplexRoPE.Config(
        dim=head_dim,
        max_seq_len=max_len,
        theta=theta,
        scaling="llama",
        scaling_factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


def titan_config(hf_config: PreTrainedConfig, *, kind: str = "causal_lm") -> Any:
    """torchtitan model args for a transformers Qwen3 / Llama config (dense models only).

    `kind="value"` replaces the vocabulary head by an untied one-output head with a bias
    (the critic's `score`). Initialisers are irrelevant (every weight is loaded) but
    torchtitan wants one per parameter.
    """
    import torchtitan.models.common.config_utils as config_utils
    from torchtitan.models.common import Embedding, Linear
    from torchtitan.models.common.nn_modules import RMSNorm

    family = family_of(hf_config)
    c = hf_config
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(c, flag, False):
            raise ValueError(f"torchtitan's {family} has no {flag}; use model.impl = 'hf'")
    dim, heads = int(c.hidden_size), int(c.num_attention_heads)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(c, "head_dim", None) or dim // heads)
    eps = float(c.rms_norm_eps)
    init: _Init = {"weight": nn.init.zeros_, "bias": nn.init.zeros_}
    builders = cast(_ConfigUtils, config_utils)

    def norm(n: int) -> RMSNorm.Config:
        return RMSNorm.Config(normalized_shape=n, eps=eps, param_init={"weight": nn.init.ones_})

    rope = _rope(c, family, head_dim)
    if family == "qwen3":
        from torchtitan.models.qwen3.model import Qwen3Model as Model
        from torchtitan.models.qwen3.model import Qwen3TransformerBlock as Block
    else:
        from torchtitan.models.llama3.model import Llama3Model as Model
        from torchtitan.models.llama3.model import Llama3TransformerBlock as Block
    layers = [
        Block.Config(
            attention_norm=norm(dim),
            ffn_norm=norm(dim),
            attention=builders.make_gqa_config(
                dim=dim,
                n_heads=heads,
                n_kv_heads=kv_heads,
                head_dim=head_dim,
                wqkv_param_init=init,
                wo_param_init=init,
                inner_attention=packed_sdpa().Config(),
                fuse_qkv=False,
                rope=rope,
                qk_norm=norm(head_dim) if family == "qwen3" else None,
            ),
            feed_forward=builders.make_ffn_config(
                dim=dim, hidden_dim=int(c.intermediate_size), w1_param_init=init, w2w3_param_init=init
            ),
        )
        for _ in range(int(c.num_hidden_layers))
    ]
    value = kind == "value"
    vocab = int(c.vocab_size)
    return Model.Config(
        vocab_size=vocab,
        dim=dim,
        norm=norm(dim),
        enable_weight_tying=bool(getattr(c, "tie_word_embeddings", False)) and not value,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=init),
        lm_head=Linear.Config(in_features=dim, out_features=1 if value else vocab, bias=value, param_init=init),
        layers=layers,
    )


# -- packed attention -------------------------------------------------------------------------
@functools.cache
def packed_sdpa() -> type[Module]:
    """The inner attention class, defined on first use: it derives from torchtitan's `Module`,
    an import that needs the CPU fixes first."""
    from torchtitan.protocols.module import Module

    class PackedSDPA(Module):
        """Causal sdpa per packed sequence: cost sum(len_i^2), no mask tensor, any device.

        Inputs are torchtitan's [B, L, heads, head_dim]; `attention_masks` is a
        `VarlenMetadata` whose `cu_seq_q` holds the sequence starts of a packed row (None:
        plain causal attention over each row, the padded layout)."""

        @dataclass(kw_only=True, slots=True)
        class Config(Module.Config):
            pass

        def __init__(self, config: Module.Config | None = None) -> None:
            super().__init__()

        def forward(
            self,
            q_BLNH: torch.Tensor,
            k_BLNH: torch.Tensor,
            v_BLNH: torch.Tensor,
            *,
            attention_masks: VarlenMetadata | None = None,
            scale: float | None = None,
            enable_gqa: bool = False,
            **kwargs: object,
        ) -> torch.Tensor:
            q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
            if attention_masks is None:
                out = F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True, enable_gqa=enable_gqa)
                return out.transpose(1, 2)
            if torch.compiler.is_compiling():  # no data-dependent slicing in a graph: one block-diagonal mask
                return _masked_sdpa(q, k, v, attention_masks.cu_seq_q, scale=scale, enable_gqa=enable_gqa)
            bounds = int_list(attention_masks.cu_seq_q)
            lens = [e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
            if bounds[0] != 0 or bounds[-1] != q.shape[2] or min(lens) <= 0:
                return _masked_sdpa(q, k, v, attention_masks.cu_seq_q, scale=scale, enable_gqa=enable_gqa)
            # split, not slices: its backward is one cat, where each slice's backward zero-fills and
            # adds a full-size gradient (measured: a third of a packed backward on CPU)
            outs = [
                F.scaled_dot_product_attention(qi, ki, vi, scale=scale, is_causal=True, enable_gqa=enable_gqa)
                for qi, ki, vi in zip(
                    torch.split(q, lens, 2), torch.split(k, lens, 2), torch.split(v, lens, 2), strict=True
                )
            ]
            return torch.cat(outs, dim=2).transpose(1, 2)

    return PackedSDPA


def _masked_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, *, scale: float | None, enable_gqa: bool
) -> torch.Tensor:
    """Packed attention as one sdpa call with a block-causal mask (what `torch.compile` traces)."""
    n = q.shape[2]
    pos = torch.arange(n, device=q.device)
    seq = torch.searchsorted(cu[1:].to(pos.dtype), pos, right=True)
    allowed = (seq[:, None] == seq[None, :]) & (pos[:, None] >= pos[None, :])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=enable_gqa)
    return out.transpose(1, 2)


# -- the wrapper the losses call ---------------------------------------------------------------
@dataclass
class LMOutput:
    logits: torch.Tensor


class TitanLM(nn.Module):
    """A torchtitan decoder behind the transformers calling convention the trainer uses.

    `config` is the HF config (export writes it; `_attn_implementation` tells packing to send
    sequence boundaries, not a mask). `adapter` is torchtitan's state-dict adapter.
    """

    varlen_only = True  # reads cu_seq_lens_q, not shared-prompt segments (ModelTrainer checks)

    def __init__(
        self,
        decoder: nn.Module,
        *,
        hf_config: PreTrainedConfig,
        adapter: _StateDictAdapter,
        kind: str,
        vocab_parallel: bool = False,
    ):
        super().__init__()
        self.decoder = decoder
        self.config = hf_config
        self.adapter = adapter
        self.kind = kind
        self.vocab_parallel = vocab_parallel  # tensor parallel shards the head over the vocabulary
        self.generation_config = None
        # the head runs on the kept rows only (forward): torchtitan's own switch, set as its trainer does
        setattr(decoder, "_skip_lm_head", True)  # noqa: B010 - a plain flag, not a submodule

    def get_output_embeddings(self) -> nn.Module | None:
        """The LM head, as transformers models answer; None under tensor parallel, where its
        output is a vocabulary-sharded DTensor: `token_logprobs` then takes the full logits."""
        return None if self.vocab_parallel else self.decoder.get_submodule("lm_head")

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        logits_to_keep: torch.Tensor | None = None,
        cu_seq_lens_q: torch.Tensor | None = None,
        max_length_q: int = 0,
        **unused: object,
    ) -> LMOutput:
        if attention_mask is not None:
            raise ValueError("the torchtitan model takes packed sequence boundaries, not an attention mask")
        masks = None
        if cu_seq_lens_q is not None:
            from torchtitan.models.common.attention import VarlenMetadata

            cu = cu_seq_lens_q.to(torch.int32)
            masks = VarlenMetadata(cu_seq_q=cu, cu_seq_k=cu, max_q=int(max_length_q), max_k=int(max_length_q))
        hidden: torch.Tensor = self.decoder(input_ids, position_ids, masks)
        if isinstance(logits_to_keep, torch.Tensor):
            hidden = _rows(hidden, logits_to_keep)
        logits: torch.Tensor = self.decoder.get_submodule("lm_head")(hidden)
        # tensor parallel: vocabulary shards
        return LMOutput(logits=logits.full_tensor() if d.is_dtensor(logits) else logits)

    # -- HF names out ------------------------------------------------------------------------
    def hf_sources(
        self, *, skip_tied: bool = True
    ) -> list[tuple[str, torch.Tensor, Callable[[torch.Tensor], torch.Tensor] | None]]:
        """(HF name, local or sharded tensor, layout change of the full tensor) in state_dict
        order; a tensor under several names (tied embeddings) once when `skip_tied`."""
        out: list[tuple[str, torch.Tensor, Callable[[torch.Tensor], torch.Tensor] | None]] = []
        seen: set[int] = set()
        for name, tensor in self.decoder.state_dict(keep_vars=True).items():
            if skip_tied and id(tensor) in seen:
                continue
            seen.add(id(tensor))
            if self.kind == "value" and name.startswith("lm_head."):  # the critic's head: HF's `score`
                out.append((name.replace("lm_head.", "score."), tensor, None))
                continue
            for hf_name in self.adapter.to_hf({name: torch.empty(tensor.shape, device="meta")}):
                out.append((hf_name, tensor, _layout(self.adapter, name, hf_name)))
        return out


def _layout(adapter: _StateDictAdapter, name: str, hf_name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def to_hf(full: torch.Tensor) -> torch.Tensor:
        return adapter.to_hf({name: full})[hf_name]

    return to_hf


def _rows(hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """hidden[keep] as [1, K, D]: the positions whose next token is scored."""
    if d.is_dtensor(hidden):  # replicated over tensor-parallel ranks after the final norm
        from torch.distributed.tensor import DTensor

        placements = hidden.placements
        mesh = hidden.device_mesh
        picked = hidden.to_local()[keep][None]
        return DTensor.from_local(picked, mesh, placements, run_check=False)
    return hidden[keep][None]


# -- weights in ---------------------------------------------------------------------------------
def hf_state_dict(cfg: ModelConfig, *, kind: str, seed: int) -> dict[str, torch.Tensor]:
    """The full HF weights: the safetensors of `model.path`; else (config-only models, and the
    critic, whose `score` head is freshly initialised) those of the transformers model
    `load_hf_model` builds with `seed`, so both implementations start from the same weights."""
    if cfg.path is not None and kind == "causal_lm":
        import safetensors.torch

        files = sorted(Path(cfg.path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"model.path {cfg.path}: no *.safetensors files")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(cast(_SafetensorsTorch, safetensors.torch).load_file(str(f)))
        return state
    model = load_hf_model(cfg.model_copy(update={"impl": "hf"}), kind=kind, seed=seed)
    return {k: v.detach() for k, v in model.state_dict().items()}


def _load_weights(model: TitanLM, state: dict[str, torch.Tensor]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    score = {k: state.pop(k) for k in list(state) if k.startswith("score.")}
    if model.kind == "value":
        state.pop("lm_head.weight", None)
    titan = model.adapter.from_hf(state)
    titan |= {k.replace("score.", "lm_head."): v for k, v in score.items()}
    set_model_state_dict(model.decoder, titan, options=StateDictOptions(full_state_dict=True, strict=True))


# -- build and parallelize ------------------------------------------------------------------------
def build_titan_model(
    cfg: ModelConfig,
    trainer: TrainerConfig,
    *,
    device: torch.device,
    kind: str = "causal_lm",
    seed: int = 0,
    trainable: bool = True,
) -> TitanLM:
    """Build on the meta device, parallelize (tp x FSDP2), materialise on `device`, load the
    HF weights. A frozen model (the reference) gets no activation checkpointing or compile."""
    on_cpu = device.type == "cpu"
    if on_cpu:
        prepare_cpu()
    hf_config = load_hf_config(cfg)
    # packing sends boundaries, not masks (transformers' own attribute, which its models read)
    hf_config._attn_implementation = PACKED_ATTENTION  # pyright: ignore[reportPrivateUsage]
    family = family_of(hf_config)
    model_cfg = titan_config(hf_config, kind=kind)
    if family == "qwen3":
        from torchtitan.models.qwen3 import parallelize_qwen3 as parallelize
        from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter as Adapter
    else:
        from torchtitan.models.llama3 import parallelize_llama as parallelize
        from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter as Adapter

    sharded = trainer.strategy == "fsdp2"
    if not sharded and d.world_size() > 1:  # one process holds the whole model (also: `rlvr export`)
        raise ValueError("trainer.strategy = 'none' runs on one process; use 'fsdp2' with torchrun")
    parallel = None
    if sharded:
        d.init_distributed(force=True)
        parallel = _parallel_settings(
            trainer, device=device, trainable=trainable, checkpointing=cfg.gradient_checkpointing
        )
        if trainer.tp_size > 1:
            _set_tp_sharding(model_cfg, family, tp=trainer.tp_size)
    with torch.device("meta"):
        decoder = model_cfg.build()
    if parallel is not None:
        parallelize(decoder, **parallel)
        if on_cpu:  # gloo has no PREMUL_SUM / AVG reduce-scatter
            from torch.distributed.fsdp import FSDPModule

            for module in decoder.modules():
                if isinstance(module, FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)
    else:  # one process: torchtitan's checkpointing and compile without its meshes
        settings = _training_settings(trainer, trainable=trainable, checkpointing=cfg.gradient_checkpointing)
        if settings["ac_config"] is not None:
            settings["ac_config"].build(dump_folder="").apply(decoder)
        if settings["compile_config"].enable:
            from torchtitan.distributed.compile import apply_compile

            apply_compile(decoder, compile_config=settings["compile_config"], parallel_dims=_NO_TP)
    decoder.to_empty(device=device)
    with torch.no_grad():
        decoder.init_states(buffer_device=device)
    model = TitanLM(
        decoder, hf_config=hf_config, adapter=Adapter(model_cfg, None), kind=kind, vocab_parallel=trainer.tp_size > 1
    )
    _load_weights(model, hf_state_dict(cfg, kind=kind, seed=seed))
    return model


_NO_TP: Any = types.SimpleNamespace(tp_enabled=False)  # what apply_compile reads of a mesh


def _set_tp_sharding(model_cfg: Any, family: str, *, tp: int) -> None:
    """What torchtitan's `update_from_config` does for tensor parallel (it imports its whole
    trainer, data loaders included, to tell a trainer config apart): check the heads, and fill
    the per-module sharding plans. No sequence parallel: rows are packed sequences of any length."""
    attention = model_cfg.layers[0].attention
    for name, count in (("num_attention_heads", attention.n_heads), ("num_key_value_heads", attention.n_kv_heads)):
        if count % tp:
            raise ValueError(f"trainer.tp_size = {tp} does not divide the model's {name} = {count}")
    if family == "qwen3":
        from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

        set_qwen3_sharding_config(model_cfg, enable_sp=False, enable_ep=False)
    else:
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config

        set_llama3_sharding_config(model_cfg, enable_sp=False)


def _training_settings(trainer: TrainerConfig, *, trainable: bool, checkpointing: bool) -> _TrainingSettings:
    """torchtitan's activation-checkpointing and compile configs for this model (a frozen
    reference gets neither: it runs no backward)."""
    from torchtitan.config import CompileConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    mode = "full" if checkpointing and trainer.activation_checkpointing == "none" else trainer.activation_checkpointing
    ac: _CheckpointingConfig | None = None
    if trainable and mode == "full":
        ac = FullAC.Config(preserve_rng_state=False)
    elif trainable and mode == "selective":
        ac = SelectiveAC.Config(preserve_rng_state=False)
    return {
        "ac_config": ac,
        "compile_config": CompileConfig(enable=trainer.compile and trainable, components=["model"]),
    }


def _parallel_settings(
    trainer: TrainerConfig, *, device: torch.device, trainable: bool, checkpointing: bool
) -> dict[str, Any]:
    """Mesh (dp = ranks / tp_size, tp) and the keyword arguments of torchtitan's parallelize functions.

    The DTensor backend ("partial_dtensor"): parameters are DTensors, activations plain
    tensors between modules, which is what the trainer's loss code handles."""
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims

    world, tp = d.world_size(), trainer.tp_size
    if world % tp:
        raise ValueError(f"trainer.tp_size = {tp} does not divide the {world} trainer ranks")
    # DTensor's hint that gathers over a (dp, tp) mesh take two collectives, once per weight sync
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    parallelism = ParallelismConfig(
        data_parallel_shard_degree=world // tp,
        tensor_parallel_degree=tp,
        enable_sequence_parallel=False,  # rows are packed sequences of any length
        spmd_backend="partial_dtensor",
    )
    dims = ParallelDims.from_config(parallelism, world)
    dims.build_mesh()
    dtype = "bfloat16" if device.type == "cuda" and trainer.param_dtype == "bfloat16" else "float32"
    training = TrainingConfig(mixed_precision_param=dtype, mixed_precision_reduce="float32")
    settings = _training_settings(trainer, trainable=trainable, checkpointing=checkpointing)
    kwargs = {"parallel_dims": dims, "training": training, "parallelism": parallelism, "dump_folder": ""}
    return {**kwargs, **settings}
