"""The decoder families rlvr has checked exact, path by path: the conformance matrix's claims.

Each family here has a tiny random-weight config in tests/unit/families with its distinctive
features switched on (a window shorter than the test sequences, soft-capping, sinks, NoPE layers,
MoE routing, local and global rope), and those tests check every claim below against
transformers' own eager forward and `generate`. docs/models.md renders this table
(`support_table`); a test keeps the page equal to it, so the page cannot drift from the checks.

A family not listed is not refused: transformers' own attention and masks stay in charge (the
trainer unpacked, the embedded engine's generic path), exact by construction and slower, and
`rlvr validate` says so in one line. What rlvr knows it cannot run exactly is refused before
anything starts (`family_problem`). No torch here: `validate` reads config.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Engine = Literal["fast", "generic"]


@dataclass(frozen=True)
class Family:
    """What the matrix checks for one `model_type`."""

    example: str  # a released model of the family
    features: str  # what its tiny config switches on, beyond Llama
    engine: Engine  # the embedded engine's decoder: static-KV fast path, or transformers' forward
    vllm: bool = False  # vLLM-CPU serves it: ids, log-probs and a push checked (tests/vllm)
    torchtitan: bool = False  # model.impl = "torchtitan" claims it (tests/unit/trainer/test_titan.py)
    flash_exact: bool = True  # transformers' flash-attention path honours all of it (sinks: no)
    vllm_refused: str | None = None  # why a push to vLLM would not be served exactly


FUSED_EXPERTS = "the push sends transformers' fused expert tensors (experts.gate_up_proj), which vLLM's loader refuses"

FAMILIES: dict[str, Family] = {
    "llama": Family("Llama 3, SmolLM2", "GQA", "fast", vllm=True, torchtitan=True),
    "mistral": Family("Mistral 7B v0.1", "sliding window on every layer", "fast", vllm=True),
    "qwen2": Family("Qwen2.5", "q/k/v biases, sliding window on upper layers", "fast", vllm=True),
    "qwen3": Family("Qwen3", "q/k norms, sliding window on upper layers", "fast", vllm=True, torchtitan=True),
    "qwen3_moe": Family("Qwen3-30B-A3B", "MoE (4 experts, top 2), q/k norms", "generic", vllm_refused=FUSED_EXPERTS),
    "gemma": Family("Gemma 2B/7B", "gelu-tanh MLP, scaled embedding, (1 + w) norms, tied head", "generic", vllm=True),
    "gemma2": Family(
        "Gemma 2", "attention and final-logit soft-capping, sliding window on alternate layers", "generic", vllm=True
    ),
    "gemma3_text": Family(
        "Gemma 3 270M-27B", "sliding window on alternate layers, local and global rope, q/k norms", "fast", vllm=True
    ),
    "phi3": Family("Phi-3/3.5 mini", "fused qkv and gate/up, sliding window", "generic", vllm=True),
    "olmo2": Family("OLMo 2", "post-norms, q/k norms over all heads", "generic", vllm=True),
    "granite": Family("Granite 3", "embedding, residual, attention and logit multipliers", "generic", vllm=True),
    "smollm3": Family("SmolLM3", "NoPE layers, sliding window on upper layers", "generic", vllm=True),
    "gpt_oss": Family(
        "gpt-oss", "attention sinks, sliding window on alternate layers, MoE, YaRN rope", "generic",
        flash_exact=False, vllm_refused=(
            "vLLM's gpt-oss loader copies expert weights and sinks around the weight loader, so a push leaves "
            "them stale without an error"
        ),
    ),
    "deepseek_v3": Family(
        "DeepSeek V3, Kimi K2", "MLA (low-rank q and kv), MoE with a shared expert", "generic",
        vllm_refused=FUSED_EXPERTS,
    ),
}  # fmt: skip


def model_type_of(hf_config: Mapping[str, Any]) -> str | None:
    """The decoder's model_type (a multimodal config's text part when it has one)."""
    text = hf_config.get("text_config")
    if isinstance(text, Mapping) and text.get("model_type"):
        return str(text["model_type"])
    kind = hf_config.get("model_type")
    return str(kind) if kind else None


def is_checked(model_type: str | None) -> bool:
    return model_type in FAMILIES


def unchecked_note(model_type: str | None) -> str | None:
    """One line for `validate` when the family is outside the matrix (None when inside)."""
    if is_checked(model_type):
        return None
    return (
        f"model_type {model_type!r} is not in rlvr's conformance matrix (docs/models.md): the trainer runs it "
        "with transformers' own attention and masks, unpacked (slower), and the embedded engine with its "
        "generic path; exact by construction, not checked"
    )


def family_problem(
    hf_config: Mapping[str, Any], *, impl: str, engine: str = "embedded"
) -> tuple[tuple[str, ...], str] | None:
    """(the recipe key, why) when this config cannot run exactly with `model.impl = impl` and
    `rollout.engine = engine`, in one line; None when it can."""
    model_type = model_type_of(hf_config)
    family = FAMILIES.get(model_type or "")
    window = hf_config.get("sliding_window") if hf_config.get("use_sliding_window") else None
    if impl == "torchtitan" and model_type not in ("qwen3", "llama"):
        return ("model", "impl"), f"torchtitan runs qwen3 and llama models, not {model_type!r}; use 'hf'"
    if impl == "torchtitan" and window:
        return ("model", "impl"), (
            f"{model_type}: sliding-window attention (sliding_window = {window}) is not supported by "
            "model.impl = 'torchtitan' (its attention has no window); set model.impl = 'hf'"
        )
    if engine == "vllm" and family is not None and family.vllm_refused:
        return ("rollout", "engine"), f"{model_type}: {family.vllm_refused}; use rollout.engine = 'embedded'"
    layers, lowest = int(hf_config.get("num_hidden_layers") or 0), hf_config.get("max_window_layers")
    if engine == "vllm" and window and lowest is not None and 0 < int(lowest) < layers:
        return ("rollout", "engine"), (
            f"{model_type}: vLLM refuses a sliding window on only some layers (max_window_layers = {lowest} of "
            f"{layers}); use rollout.engine = 'embedded'"
        )
    return None


def uses_sinks(model_type: str | None) -> bool:
    """Attention sinks, which transformers' flash-attention path does not apply."""
    family = FAMILIES.get(model_type or "")
    return family is not None and not family.flash_exact


def support_table() -> str:
    """docs/models.md's matrix, one row per family: what each path is, as the tests check it."""
    head = (
        "| family (`model_type`) | e.g. | switched on in its test config | trainer (`hf`) | LoRA "
        "| embedded engine | vLLM-CPU | SGLang | torchtitan |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for name, f in FAMILIES.items():
        trainer = "exact" if f.flash_exact else "exact (packed attention also on GPU: flash-attn drops sinks)"
        titan = "exact (no window: a window is refused)" if f.torchtitan else "refused (use `hf`)"
        engine = f"exact ({'static-KV fast path' if f.engine == 'fast' else 'generic path'})"
        vllm = "exact" if f.vllm else f"refused: {f.vllm_refused}" if f.vllm_refused else "unchecked"
        cells = [f"`{name}`", f.example, f.features, trainer, "exact", engine, vllm, "unchecked (needs a GPU)", titan]
        rows.append("| " + " | ".join(cells) + " |")
    rows.append(
        "| any other | | | transformers' own attention and masks, unpacked (a note) | same | exact (generic path) "
        "| unchecked | unchecked | refused |"
    )
    return head + "\n".join(rows) + "\n"
