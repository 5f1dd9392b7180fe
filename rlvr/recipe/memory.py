"""How much GPU memory each GPU of a plan needs, before anything starts (`rlvr plan`, `rlvr validate`).

Per trainer GPU: its FSDP2 shard of fp32 parameters, gradients and AdamW's two states, the
reference's and the critic's shards, the blocks FSDP2 gathers for compute, and one micro-batch's
activations with and without checkpointing. Per rollout GPU: the engine's weights per TP shard and
its KV cache at the memory fraction. A colocated GPU counts the larger of its two phases. Exact
terms come from the tensors' shapes (safetensors headers of `model.path`, or the Llama/Qwen layer
shapes of `model.config`), checked by unit tests against a tiny model's real tensors; activations
and the KV cache at a fraction are estimates, checked against CUDA in tests/gpu. No torch here
(docs/cluster.md, "Memory per GPU").
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.recipe.model_folder import longest_sequence
from rlvr.recipe.plan import LaunchPlan
from rlvr.recipe.schema import Recipe

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8}
FP32 = 4
ADAM_STATES = 2  # exp_avg and exp_avg_sq, each in the parameter's dtype (fp32 master weights)
GATHERED_BLOCKS = 2  # FSDP2 holds the block it computes and prefetches the next one

Shape = tuple[int, ...]


# -- the model's tensors -----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a model: every parameter's shape, and the attention geometry."""

    tensors: dict[str, Shape]
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    positions: int

    @property
    def params(self) -> int:
        return sum(math.prod(shape) for shape in self.tensors.values())

    def block_params(self) -> int:
        """Parameters of the largest decoder block (`model.layers.<i>.`): what FSDP2 gathers at once."""
        blocks: dict[str, int] = {}
        for name, shape in self.tensors.items():
            parts = name.split(".")
            if "layers" in parts:
                key = ".".join(parts[: parts.index("layers") + 2])
                blocks[key] = blocks.get(key, 0) + math.prod(shape)
        return max(blocks.values(), default=0)

    def kv_bytes_per_token(self, *, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of one token in every layer, for one TP shard (KV heads split, or replicated
        when tp exceeds them)."""
        return 2 * self.layers * max(1, math.ceil(self.kv_heads / tp)) * self.head_dim * dtype_bytes


def llama_tensors(config: dict[str, Any]) -> dict[str, Shape]:
    """The parameter shapes of a Llama-family decoder (llama, mistral, qwen2, qwen3) from its HF config,
    named as transformers names them."""
    h, v, inter = int(config["hidden_size"]), int(config["vocab_size"]), int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    hd = int(config.get("head_dim") or h // heads)
    model_type = config.get("model_type", "llama")
    qkv_bias = bool(config.get("attention_bias", model_type == "qwen2"))
    o_bias = bool(config.get("attention_bias", False)) and model_type != "qwen2"
    mlp_bias = bool(config.get("mlp_bias", False))
    tensors: dict[str, Shape] = {"model.embed_tokens.weight": (v, h)}
    for i in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{i}."
        for name, out in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            tensors[f"{p}self_attn.{name}.weight"] = (out, h)
            if qkv_bias:
                tensors[f"{p}self_attn.{name}.bias"] = (out,)
        tensors[f"{p}self_attn.o_proj.weight"] = (h, heads * hd)
        if o_bias:
            tensors[f"{p}self_attn.o_proj.bias"] = (h,)
        if model_type == "qwen3":
            tensors[f"{p}self_attn.q_norm.weight"] = (hd,)
            tensors[f"{p}self_attn.k_norm.weight"] = (hd,)
        for name, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
            tensors[f"{p}mlp.{name}.weight"] = shape
            if mlp_bias:
                tensors[f"{p}mlp.{name}.bias"] = (shape[0],)
        tensors[f"{p}input_layernorm.weight"] = (h,)
        tensors[f"{p}post_attention_layernorm.weight"] = (h,)
    tensors["model.norm.weight"] = (h,)
    if not config.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = (v, h)
    return tensors


def safetensors_shapes(folder: Path) -> dict[str, Shape]:
    """Every tensor's shape from the headers of a model folder's .safetensors files (the first 8
    bytes give the JSON header's length; the weights themselves are never read)."""
    shapes: dict[str, Shape] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(int(d) for d in info["shape"])
    return shapes


def model_shape(recipe: Recipe) -> ModelShape | None:
    """The recipe's model, or None when neither its weights' headers nor its config can say."""
    config = recipe.model.config
    tensors: dict[str, Shape] = {}
    if recipe.model.path is not None:
        folder = Path(recipe.model.path)
        try:
            config = json.loads((folder / "config.json").read_text())
            tensors = safetensors_shapes(folder)
        except (OSError, ValueError, struct.error):
            return None
    if not config:
        return None
    config = {**config, **(config.get("text_config") or {})}
    try:
        if not tensors:
            tensors = llama_tensors(config)
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return ModelShape(
            tensors=tensors,
            hidden=hidden,
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config.get("intermediate_size") or 4 * hidden),
            vocab=int(config["vocab_size"]),
            positions=int(config.get("max_position_embeddings") or 0),
        )
    except (KeyError, TypeError, ValueError):
        return None


def unknown_shape(recipe: Recipe) -> str:
    """Why `model_shape` has no answer, in the words `rlvr plan` prints (a SLURM model folder that
    lives on the nodes only is the common case). With config.json alone (a hub id `plan` peeked
    at) there is an answer: Llama-family shapes from the config."""
    path = recipe.model.path
    if path is not None and not (Path(path) / "config.json").is_file():
        return f"no {Path(path) / 'config.json'} on this machine to read the model's shapes from"
    return (
        "the model's shapes are unknown (config.json lacks hidden_size, num_attention_heads, num_hidden_layers or "
        "vocab_size, and there are no safetensors headers to read)"
    )


def lora_params(tensors: dict[str, Shape], *, rank: int, targets: list[str] | str) -> int:
    """Adapter parameters r * (in + out) of every adapted linear weight: each 2-D weight of a decoder
    block ("all-linear"; never the embeddings or the LM head), or those whose module name is listed."""
    total = 0
    for name, shape in tensors.items():
        parts = name.split(".")
        if len(shape) != 2 or "layers" not in parts or parts[-1] != "weight":
            continue
        if targets == "all-linear" or parts[-2] in targets:
            total += rank * (shape[0] + shape[1])
    return total


def shard_elements(tensors: dict[str, Shape], world: int) -> int:
    """Elements of the largest FSDP2 shard over `world` ranks: each tensor is split on dim 0 into
    `world` chunks of ceil(dim0 / world) rows (torch.chunk; the first rank's is the largest)."""
    total = 0
    for shape in tensors.values():
        if not shape:
            total += 1
            continue
        total += math.ceil(shape[0] / world) * math.prod(shape[1:])
    return total


def value_tensors(tensors: dict[str, Shape], hidden: int) -> dict[str, Shape]:
    """The critic: the policy's backbone plus a scalar head (`score`) instead of lm_head."""
    backbone = {k: s for k, s in tensors.items() if not k.startswith("lm_head")}
    return {**backbone, "score.weight": (1, hidden), "score.bias": (1,)}


# -- terms and estimates -----------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """One thing held on a GPU: its size, and the recipe key that changes it (with how)."""

    name: str
    bytes: int
    key: str
    hint: str
    exact: bool = True


@dataclass
class GpuLoad:
    """What one GPU of a role holds at its peak; `note` carries extra facts (KV tokens, samples)."""

    role: str
    gpus: list[int]
    terms: list[Term] = field(default_factory=list)
    note: str = ""
    shortfall: tuple[str, str] | None = None  # (key, why): fits the GPU, yet cannot run (no KV cache left)

    @property
    def total(self) -> int:
        return sum(t.bytes for t in self.terms)

    def largest(self) -> Term:
        return max(self.terms, key=lambda t: t.bytes)


@dataclass
class MemoryEstimate:
    loads: list[GpuLoad]
    gpu_bytes: int | None
    gpu_source: str  # "cluster.gpu_memory_gb", "nvidia-smi", or "" (unknown: no fit check)
    skipped: str = ""  # why there is no estimate (CPU run, unknown architecture)

    def problem(self) -> tuple[tuple[str, ...], str] | None:
        """The first GPU load over the GPU's memory: (key of its largest term, one line)."""
        if self.gpu_bytes is None:
            return None
        for load in self.loads:
            if load.shortfall is not None:
                key, why = load.shortfall
                return tuple(key.split(".")), f"{load.role}: {why}"
            if load.total > self.gpu_bytes:
                big = load.largest()
                gpus = ",".join(map(str, load.gpus)) or "-"
                message = (
                    f"{load.role} needs ~{gib(load.total)} GiB per GPU (GPU {gpus}) but a GPU has {gib(self.gpu_bytes)} "
                    f"GiB ({self.gpu_source}); the largest part is {big.name} ({gib(big.bytes)} GiB): {big.hint}"
                )
                return tuple(big.key.split(".")), message
        return None


def gib(n: int) -> str:
    """GiB with the digits that matter: 0.03 for a tiny model, 71.4 for a large one."""
    return f"{n / GIB:.2f}" if n < 10 * GIB else f"{n / GIB:.1f}"


def detected_gpu_bytes() -> int | None:
    """The first GPU's memory from nvidia-smi (no torch: `validate` stays instant), or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return int(float(out.split()[0]) * 1024**2)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def activation_bytes(
    shape: ModelShape, *, tokens: int, compute: int, checkpointing: bool, logits_chunk: int = 0
) -> int:
    """Activations one micro-batch of `tokens` tokens keeps for backward, at its peak.

    Per token and layer, what a Llama block saves (HF code, sdpa/flash attention): each RMSNorm its
    fp32 upcast and its output (4H + cH), q/k/v and their rotated copies, the attention output
    and its reshaped copy (4 q + 3 kv widths), gate, up, silu(gate) and their product (4I), the
    attention's log-sum-exp (fp32 per head). With full checkpointing only each block's input
    stays, and one block's activations are rebuilt at a time. The log-probs add `tokens x vocab`
    logits: the fp32 log-softmax kept for backward, and in backward its gradient, the upcast's
    fp32 gradient and the compute-dtype one (counted for every token: an upper bound, as only
    response positions reach the vocabulary projection). With `logits_chunk` > 0
    (`trainer.logits_chunk_tokens`, rlvr.trainer.chunked_logprobs) only one chunk's logits exist:
    the head's compute-dtype output and two fp32 blocks, plus, below fp32, the head gradient's fp32
    accumulator.
    """
    h, q, kv, i = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    per_layer = 2 * (FP32 * h + compute * h) + compute * (4 * q + 3 * kv + 4 * i) + FP32 * shape.heads
    kept = shape.layers * per_layer if not checkpointing else shape.layers * compute * h + per_layer
    if logits_chunk <= 0:
        return tokens * (kept + shape.vocab * (compute + 3 * FP32))
    chunk = min(tokens, logits_chunk) * shape.vocab * (compute + 2 * FP32)
    accumulator = shape.vocab * h * FP32 if compute != FP32 else 0
    return tokens * kept + chunk + accumulator


def trainer_terms(recipe: Recipe, plan: LaunchPlan, shape: ModelShape, *, on_gpu: bool) -> list[Term]:
    t, algo = recipe.trainer, recipe.algorithm
    world = plan.trainer_world_size if t.strategy == "fsdp2" else 1
    shard = shard_elements(shape.tensors, world)
    ranks_hint = "more trainer ranks shard it further (trainer.ranks" + (
        ")" if plan.kind == "local" else "; on SLURM cluster.trainer_nodes)"
    )
    ranks_key = "trainer.ranks" if plan.kind == "local" else "cluster.trainer_nodes"
    compute = DTYPE_BYTES[t.param_dtype] if on_gpu else FP32
    terms = [Term(f"parameters (fp32 shard of {world})", shard * FP32, ranks_key, ranks_hint)]
    trained, what = shard, "fp32 shard"
    if t.lora.enabled:  # the base is frozen: gradients and AdamW states of the adapters only
        trained = math.ceil(lora_params(shape.tensors, rank=t.lora.rank, targets=t.lora.target_modules) / world)
        terms.append(
            Term(f"LoRA adapters (rank {t.lora.rank}, fp32)", trained * FP32, "trainer.lora.rank", "a lower rank")
        )
        what = "adapters"
    terms += [
        Term(f"gradients ({what})", trained * FP32, ranks_key, ranks_hint),
        Term(f"AdamW states (2 x fp32, {what})", trained * FP32 * ADAM_STATES, ranks_key, ranks_hint),
    ]
    if world > 1:
        gathered = GATHERED_BLOCKS * shape.block_params() * compute
        terms.append(Term(f"gathered blocks ({t.param_dtype})", gathered, ranks_key, ranks_hint, exact=False))
    checkpointing = t.activation_checkpointing != "none" or recipe.model.gradient_checkpointing
    tokens = t.max_tokens_per_micro_batch
    chunk = t.logits_chunk_tokens
    act = activation_bytes(shape, tokens=tokens, compute=compute, checkpointing=checkpointing, logits_chunk=chunk)
    other = activation_bytes(shape, tokens=tokens, compute=compute, checkpointing=not checkpointing, logits_chunk=chunk)
    label = "with" if checkpointing else "without"
    hint = f"lower trainer.max_tokens_per_micro_batch (now {tokens})"
    if not checkpointing:
        hint += f', or set trainer.activation_checkpointing = "full" (~{gib(other)} GiB)'
    terms.append(
        Term(
            f"activations, {tokens} tokens {label} checkpointing",
            act,
            "trainer.max_tokens_per_micro_batch",
            hint,
            False,
        )
    )
    if algo.needs_reference and not t.lora.enabled:  # LoRA's reference is its own base, adapters off
        terms.append(
            Term(
                "reference model (fp32 shard)",
                shard * FP32,
                "algorithm.kl_coef",
                "kl_coef = 0 with kl_in = 'none' drops the reference model, or more trainer ranks shard it",
            )  # fmt: skip
        )
    if algo.critic:
        critic = shard_elements(value_tensors(shape.tensors, shape.hidden), world)
        terms.append(
            Term(
                "critic (params, grads, AdamW)",
                critic * FP32 * (2 + ADAM_STATES),
                "algorithm.critic",
                "a critic-free estimator (algorithm.preset = 'grpo') drops it, or more trainer ranks shard it",
            )  # fmt: skip
        )
    return terms


def engine_load(recipe: Recipe, shape: ModelShape, *, gpus: list[int], gpu_bytes: int | None, role: str) -> GpuLoad:
    """One rollout server's GPU: weights per TP shard, and the KV cache its memory setting leaves."""
    rollout = recipe.rollout
    engine = rollout.engine
    tp = rollout.vllm.tp_size if engine == "vllm" else rollout.sglang.tp_size if engine == "sglang" else 1
    dtype = recipe.model.dtype if gpus else "float32"
    if engine == "vllm" and rollout.vllm.dtype not in (None, "auto"):
        dtype = rollout.vllm.dtype or dtype
    width = DTYPE_BYTES[dtype]
    weights = sum(math.ceil(math.prod(s) / tp) for s in shape.tensors.values()) * width
    tp_key = {"vllm": "rollout.vllm.tp_size", "sglang": "rollout.sglang.tp_size"}.get(engine, "model.dtype")
    tp_hint = "a larger tensor-parallel size splits it" if engine != "embedded" else "a smaller model or dtype"
    load = GpuLoad(role, gpus, [Term(f"weights ({dtype}, 1/{tp} shard)", weights, tp_key, tp_hint)])
    per_token = shape.kv_bytes_per_token(dtype_bytes=width, tp=tp)
    sample = longest_sequence(recipe, capped=False)  # a tool episode's turns are in its sample
    if engine == "embedded":
        max_len = longest_sequence(recipe)  # what the launcher passes as `rlvr serve --max-seq-len`
        kv = per_token * rollout.max_batch * max_len
        key, hint = "rollout.max_batch", "lower rollout.max_batch"
        load.terms.append(Term("KV cache", kv, key, hint))
        cut = f" (a {sample}-token sample is cut at {max_len})" if sample > max_len else ""
        load.note = f"KV cache {rollout.max_batch * max_len:,} tokens = {rollout.max_batch} sequences of {max_len}{cut}"
        return load
    else:
        fraction = rollout.vllm.gpu_memory_utilization if engine == "vllm" else rollout.sglang.mem_fraction_static
        key = "rollout.vllm.gpu_memory_utilization" if engine == "vllm" else "rollout.sglang.mem_fraction_static"
        hint = f"lower {key} (now {fraction:g})"
        if gpu_bytes is None:
            load.note = f"KV cache: {key} = {fraction:g} of an unknown GPU (set cluster.gpu_memory_gb)"
            return load
        kv = max(0, int(fraction * gpu_bytes) - weights)
        if kv == 0:
            load.shortfall = (key, f"its weights ({gib(weights)} GiB per GPU) fill {key} = {fraction:g} of a "
                              f"{gib(gpu_bytes)} GiB GPU, leaving no KV cache; raise it, or {tp_key}")  # fmt: skip
        tokens = kv // per_token
    load.terms.append(Term("KV cache", kv, key, hint, exact=False))
    load.note = f"KV cache {tokens:,} tokens = {tokens // max(sample, 1):,} samples of {sample} tokens"
    return load


def estimate(recipe: Recipe, plan: LaunchPlan, *, gpu_bytes: int | None = None) -> MemoryEstimate:
    """The per-GPU estimate of `plan`; `gpu_bytes` overrides cluster.gpu_memory_gb and detection."""
    source = "given"
    if gpu_bytes is None and recipe.cluster.gpu_memory_gb:
        gpu_bytes, source = int(recipe.cluster.gpu_memory_gb * GIB), "cluster.gpu_memory_gb"
    if gpu_bytes is None and plan.gpus_per_node and plan.kind == "local":
        gpu_bytes, source = detected_gpu_bytes(), "nvidia-smi"
    if gpu_bytes is None:
        source = ""
    if not plan.gpus_per_node:
        return MemoryEstimate([], None, "", skipped="CPU run: no GPU memory to estimate")
    shape = model_shape(recipe)
    if shape is None:
        return MemoryEstimate([], gpu_bytes, source, skipped=unknown_shape(recipe))
    gpus = plan.trainer_gpus or list(range(plan.gpus_per_node))  # SLURM: every GPU of a trainer node
    trainer = GpuLoad("trainer rank", gpus, trainer_terms(recipe, plan, shape, on_gpu=True))
    first = plan.servers[0]  # every server of a plan is alike: one stands for all
    role = f"rollout server (x{len(plan.servers)})" if len(plan.servers) > 1 else "rollout server"
    engine = engine_load(recipe, shape, gpus=first.gpus, gpu_bytes=gpu_bytes, role=role)
    if not plan.colocate:
        return MemoryEstimate([trainer, engine], gpu_bytes, source)
    # Colocated: while training the engine sleeps (vLLM and SGLang give all back; the embedded
    # engine keeps its weights); while generating the trainer keeps its resident state.
    # Between steps the trainer's gradients are freed (zero_grad(set_to_none=True)); its weights,
    # AdamW states, reference and critic stay.
    resident = [_without_grads(t) for t in trainer.terms if t.exact and not t.name.startswith("gradients")]
    sleeping = [t for t in engine.terms if recipe.rollout.engine == "embedded" and t.name.startswith("weights")]
    training = GpuLoad("colocated, training", trainer.gpus, trainer.terms + sleeping)
    generating = GpuLoad("colocated, generating", trainer.gpus, resident + engine.terms, note=engine.note)
    return MemoryEstimate([training, generating], gpu_bytes, source)


def _without_grads(term: Term) -> Term:
    """The critic's term between steps: its parameters and AdamW states, not its gradients."""
    if not term.name.startswith("critic"):
        return term
    resident = term.bytes * (1 + ADAM_STATES) // (2 + ADAM_STATES)
    return Term("critic (params, AdamW)", resident, term.key, term.hint, term.exact)
