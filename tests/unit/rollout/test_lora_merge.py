"""LoRA adapters merged into the base weights (rlvr.server.lora_merge) and the embedded engine's adapter load.

The reference is peft itself: an adapter folder written by `save_pretrained` and merged by
`merge_and_unload` on the quickstart policy (Qwen3, tied embeddings, 3 layers).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlvr.bridge import run_blocking
from rlvr.server.lora_merge import AdapterError, AdapterMerge

ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "recipes" / "quickstart" / "policy"
VLLM_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def base_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(POLICY, dtype=torch.float32).eval()


def write_adapter(path: Path, targets: list[str], *, seed: int, r: int = 4, alpha: int = 8, **lora) -> Path:
    """A peft adapter folder for the quickstart policy, lora_A and lora_B random (seeded) so it changes the model."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base_model(), LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, **lora))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.15)
    model.save_pretrained(str(path))
    return path


def two_adapters(root: Path) -> dict[str, Path]:
    """The adapters the LoRA merge tests share: q/v/down at rank 4, and o/q at rank 2 with another alpha."""
    return {
        "qvd": write_adapter(root / "qvd", ["q_proj", "v_proj", "down_proj"], seed=1),
        "oq": write_adapter(root / "oq", ["o_proj", "q_proj"], seed=2, r=2, alpha=16),
    }


def peft_merged(adapter: Path) -> dict[str, torch.Tensor]:
    """peft's own merge of the folder (read back from disk, as an engine reads it)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base_model(), adapter).merge_and_unload().state_dict()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    return two_adapters(tmp_path_factory.mktemp("adapters"))


@pytest.fixture(scope="module")
def base() -> dict[str, torch.Tensor]:
    return load_file(str(POLICY / "model.safetensors"))


def test_merged_weights_equal_peft_merge_and_unload(adapters, base) -> None:
    merged = dict(AdapterMerge(adapters["qvd"], POLICY).tensors())
    expected = peft_merged(adapters["qvd"])
    layers = range(3)
    names = {
        f"model.layers.{i}.{m}.weight"
        for i in layers
        for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
    }
    assert set(merged) == names  # only what the adapter targets: every other weight stays as it is
    for name, tensor in merged.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, expected[name]), name
        assert not torch.equal(tensor, base[name]), f"{name}: the adapter changed nothing (test has no teeth)"
    untouched = set(base) - names
    assert all(torch.equal(expected[n], base[n]) for n in untouched)


def test_merge_runs_in_fp32_then_casts(adapters) -> None:
    merged = dict(AdapterMerge(adapters["qvd"], POLICY).tensors(dtype=torch.bfloat16))
    expected = peft_merged(adapters["qvd"])
    for name, tensor in merged.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, expected[name].to(torch.bfloat16)), name


def test_rslora_scale(tmp_path) -> None:
    adapter = write_adapter(tmp_path / "rs", ["k_proj"], seed=3, r=4, alpha=8, use_rslora=True)
    expected = peft_merged(adapter)
    merged = dict(AdapterMerge(adapter, POLICY).tensors())
    assert merged and all(torch.equal(t, expected[n]) for n, t in merged.items())


def test_a_second_adapter_replaces_the_first(adapters, base) -> None:
    """Loaded after `qvd`: q_proj is `oq`'s alone (from the base, not on top of `qvd`), o_proj is
    merged, and v_proj / down_proj, which only `qvd` targeted, go back to the base."""
    first = AdapterMerge(adapters["qvd"], POLICY)
    second = AdapterMerge(adapters["oq"], POLICY, previous=first.merged)
    merged = dict(second.tensors())
    expected = peft_merged(adapters["oq"])
    assert second.restored == {n for n in first.merged if "q_proj" not in n}
    assert set(merged) == second.merged | second.restored
    for name, tensor in merged.items():
        assert torch.equal(tensor, expected[name]), name
    for name in second.restored:
        assert torch.equal(merged[name], base[name]), name


def test_vllm_siblings_complete_every_fused_layer(tmp_path) -> None:
    """q_proj alone touches vLLM's qkv_proj (so k/v and every bias come too); up_proj touches
    gate_up_proj; o_proj's bias comes with the restored o_proj. Fused members stay adjacent."""
    base = tmp_path / "base"
    base.mkdir()
    shapes = {"q_proj": (8, 4), "k_proj": (4, 4), "v_proj": (4, 4), "o_proj": (4, 8)}
    tensors = {f"model.layers.0.self_attn.{m}.{p}": torch.randn(s if p == "weight" else s[:1])
               for m, s in shapes.items() for p in ("weight", "bias")}  # fmt: skip
    tensors |= {f"model.layers.0.mlp.{m}.weight": torch.randn(6, 4) for m in ("gate_proj", "up_proj")}
    tensors |= {"model.layers.0.mlp.down_proj.weight": torch.randn(4, 6), "model.norm.weight": torch.ones(4)}
    save_file(tensors, str(base / "model.safetensors"))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2}))
    lora = {}
    for module, (out, inp) in {"self_attn.q_proj": (8, 4), "mlp.up_proj": (6, 4)}.items():
        lora[f"base_model.model.model.layers.0.{module}.lora_A.weight"] = torch.randn(2, inp)
        lora[f"base_model.model.model.layers.0.{module}.lora_B.weight"] = torch.randn(out, 2)
    save_file(lora, str(adapter / "adapter_model.safetensors"))

    merge = AdapterMerge(adapter, base, previous={"model.layers.0.self_attn.o_proj.weight"}, packed_modules=VLLM_PACKED)
    attn = "model.layers.0.self_attn"
    assert merge.merged == {f"{attn}.q_proj.weight", "model.layers.0.mlp.up_proj.weight"}
    assert merge.restored == {f"{attn}.o_proj.weight"}
    assert merge.siblings == {
        *(f"{attn}.{m}.bias" for m in ("q_proj", "k_proj", "v_proj", "o_proj")),
        f"{attn}.k_proj.weight",
        f"{attn}.v_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
    }
    qkv = [i for i, n in enumerate(merge.names) if any(m in n for m in ("q_proj", "k_proj", "v_proj"))]
    assert qkv == list(range(qkv[0], qkv[0] + 6))
    out = dict(merge.tensors())
    assert list(out) == merge.names
    assert all(torch.equal(out[n], tensors[n]) for n in merge.siblings | merge.restored)
    assert not AdapterMerge(adapter, base).siblings  # the embedded engine needs none


def _broken(adapters: dict[str, Path], tmp_path: Path, how: str) -> Path:
    folder = tmp_path / how
    shutil.copytree(adapters["qvd"], folder)
    weights = folder / "adapter_model.safetensors"
    config = folder / "adapter_config.json"
    tensors = load_file(str(weights))
    key = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
    if how == "no weights":
        weights.unlink()
    elif how == "no config":
        config.unlink()
    elif how == "wrong shape":
        tensors[key] = torch.zeros(4, 64)
        save_file(tensors, str(weights))
    elif how == "half a pair":
        del tensors[key]
        save_file(tensors, str(weights))
    elif how == "embedding lora":
        tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = torch.zeros(4, 102)
        save_file(tensors, str(weights))
    elif how == "not in base":
        tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(4, 128)
        tensors["base_model.model.lm_head.lora_B.weight"] = torch.zeros(102, 4)
        save_file(tensors, str(weights))
    elif how in ("dora", "r mismatch", "not json"):
        data = json.loads(config.read_text())
        data |= {"use_dora": True} if how == "dora" else {"r": 8}
        config.write_text("{" if how == "not json" else json.dumps(data))
    elif how == "not safetensors":
        weights.write_bytes(b"\x00" * 16)
    return folder


BROKEN = {
    "no weights": "adapter_model.safetensors in {folder}: missing",
    "no config": "adapter_config.json in {folder}: missing",
    "wrong shape": "layers.1.self_attn.q_proj.lora_A.weight has shape [4, 64], expected [4, 128]",
    "half a pair": "layers.1.self_attn.q_proj.lora_A.weight is missing",
    "embedding lora": "lora_embedding_A' is not a LoRA linear weight",
    "not in base": "lm_head.weight, which the base model's files do not hold",
    "dora": "use_dora = True is not supported",
    "r mismatch": "layers.0.mlp.down_proj.lora_A.weight has shape [4, 512], expected [8, 512] (r = 8",
    "not json": "adapter_config.json in {folder}: not readable JSON",
    "not safetensors": "adapter_model.safetensors in {folder}: not a readable safetensors file",
}


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_a_broken_folder_fails_with_one_line(adapters, tmp_path, how: str) -> None:
    folder = _broken(adapters, tmp_path, how)
    with pytest.raises(AdapterError) as info:
        AdapterMerge(folder, POLICY)
    message = str(info.value)
    assert "\n" not in message and BROKEN[how].format(folder=folder) in message, message
    assert str(folder) in message


# -- the embedded engine -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine():
    from rlvr.server.embedded import EmbeddedEngine

    engine = EmbeddedEngine(str(POLICY), max_batch=4, device="cpu", max_seq_len=128)
    yield engine
    engine.close()


def _weights(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


def test_embedded_engine_serves_base_plus_adapter_and_replaces_it(engine, adapters, tmp_path, base) -> None:
    run_blocking(engine.load_lora_adapter(adapters["qvd"], version="3"))
    assert engine.weight_version == "3"
    live = _weights(engine)
    expected = peft_merged(adapters["qvd"])
    assert all(torch.equal(live[n], expected[n]) for n in expected), "engine != peft merge_and_unload"

    run_blocking(engine.load_lora_adapter(adapters["oq"], version="4"))
    live = _weights(engine)
    expected = peft_merged(adapters["oq"])
    assert engine.weight_version == "4"
    assert all(torch.equal(live[n], expected[n]) for n in expected), "the second adapter did not replace the first"

    for how in ("wrong shape", "no weights"):
        with pytest.raises(AdapterError):
            run_blocking(engine.load_lora_adapter(_broken(adapters, tmp_path, how), version="5"))
        assert engine.weight_version == "4"
        assert all(torch.equal(t, live[n]) for n, t in _weights(engine).items()), how

    run_blocking(
        engine.load_lora_adapter(adapters["qvd"], version="6")
    )  # back to the first: o_proj returns to the base
    live = _weights(engine)
    assert all(torch.equal(live[n], t) for n, t in peft_merged(adapters["qvd"]).items())
