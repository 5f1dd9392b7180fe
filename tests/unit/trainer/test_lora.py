"""LoRA on the policy (rlvr.trainer.lora): what trains, its gradient, the reference, the merged and
adapter views, and checkpoints of adapters only."""

from __future__ import annotations

import json

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from rlvr.trainer.checkpoint import load_checkpoint, save_checkpoint
from rlvr.trainer.lora import adapters_disabled, write_adapter
from rlvr.trainer.step import update_policy
from rlvr.trainer.weights import iter_full_weights

from .conftest import build_actor, make_batch

LORA = {"rank": 4, "alpha": 8.0}


def lora_actor(model_dir, **kwargs):
    from rlvr.recipe.schema import LoraConfig

    return build_actor(model_dir, lora=LoraConfig(**{**LORA, **kwargs.pop("lora", {})}), **kwargs)


def _params(actor) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in actor.model.named_parameters()}


def _capture_grads(actor) -> dict[str, torch.Tensor]:
    """Replace the optimizer's step by a copy of the gradients it would have applied."""
    grads: dict[str, torch.Tensor] = {}

    def step(*_args, **_kwargs):
        for name, p in actor.model.named_parameters():
            if p.grad is not None:
                grads[name] = p.grad.detach().clone()

    actor.optimizer.step = step
    return grads


def test_a_step_moves_only_the_adapters(tiny_model_dir):
    actor = lora_actor(tiny_model_dir)
    before = _params(actor)
    update_policy(actor, make_batch())
    after = _params(actor)
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and all(".lora_" in n for n in moved)
    assert all(torch.equal(before[n], after[n]) for n in before if ".lora_" not in n)  # base bit-identical
    assert {id(p) for p in actor.optimizer.param_groups[0]["params"]} == {
        id(p) for n, p in actor.model.named_parameters() if ".lora_" in n
    }


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_the_gradient_is_the_full_gradient_through_the_adapter(tiny_model_dir):
    """At B = 0 the chain rule through W + s * B @ A gives dL/dB = s * dL/dW @ A^T and dL/dA = 0:
    checked against a full fine-tuning actor's dL/dW on the same batch (no peft involved)."""
    batch = make_batch()
    lora = lora_actor(tiny_model_dir, grad_clip=0.0)
    full = build_actor(tiny_model_dir, grad_clip=0.0)
    lora_grads, full_grads = _capture_grads(lora), _capture_grads(full)
    update_policy(lora, batch)
    update_policy(full, batch)
    scaling = LORA["alpha"] / LORA["rank"]
    checked = 0
    for name, p in lora.model.named_parameters():
        if ".lora_A.default." not in name:
            continue
        path = name.split(".lora_A.default.")[0]
        a = p.detach()
        g_w = full_grads[f"{path}.weight"]
        torch.testing.assert_close(
            lora_grads[f"{path}.lora_B.default.weight"], scaling * g_w @ a.T, rtol=1e-4, atol=1e-6
        )
        assert torch.count_nonzero(lora_grads[name]) == 0
        checked += 1
    assert checked == 7 * lora.model.config.num_hidden_layers  # q k v o gate up down of every block


def test_the_reference_is_the_base_model(tiny_model_dir):
    batch = make_batch()
    actor = lora_actor(tiny_model_dir)
    plain = build_actor(tiny_model_dir)
    for _ in range(2):
        update_policy(actor, batch)  # the adapters are no longer zero
    base_logp = plain.compute_logprobs(batch)[0]
    torch.testing.assert_close(actor.compute_logprobs(batch, reference=True)[0], base_logp, rtol=0, atol=1e-5)
    assert not torch.allclose(actor.compute_logprobs(batch)[0], base_logp, atol=1e-4)
    with adapters_disabled(actor.model):  # leaves what trains untouched (FSDP2 and the optimizer see it)
        assert all(p.requires_grad for n, p in actor.model.named_parameters() if ".lora_" in n)


def test_merged_weights_and_the_adapter_folder_reproduce_the_model(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    actor = lora_actor(tiny_model_dir)
    for _ in range(2):
        update_policy(actor, make_batch())
    ids = torch.tensor([[2, 10, 11, 12, 40, 41]])
    with torch.no_grad():
        want = actor.model(input_ids=ids).logits
    merged = dict(iter_full_weights(actor.model))
    assert not any("lora" in n or "base_layer" in n for n in merged)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert set(merged) == set(dict(iter_full_weights(plain)))
    plain.load_state_dict(merged, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, want, rtol=1e-4, atol=1e-5)

    folder = write_adapter(actor.model, tmp_path / "adapter")
    assert folder is not None and sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors",
    ]  # fmt: skip
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and "q_proj" in config["target_modules"]
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, folder).eval()
    with torch.no_grad():
        torch.testing.assert_close(peft_model(input_ids=ids).logits, want, rtol=1e-4, atol=1e-5)


def test_a_checkpoint_holds_the_adapters_and_resumes_bit_identically(tiny_model_dir, tmp_path):
    batch = make_batch()
    a = lora_actor(tiny_model_dir)
    update_policy(a, batch)
    folder = save_checkpoint(tmp_path / "ckpt", 1, {"actor": a})
    later = [update_policy(a, batch)["loss"] for _ in range(2)]
    b = lora_actor(tiny_model_dir)
    load_checkpoint(folder, {"actor": b})
    assert [update_policy(b, batch)["loss"] for _ in range(2)] == later
    pa, pb = _params(a), _params(b)
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert json.loads((folder / "meta.json").read_text())["lora"] == {"actor": 4}
    keys = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    weights = {k.removeprefix("actor.model.") for k in keys if k.startswith("actor.model.")}
    assert weights == {n for n in _params(a) if ".lora_" in n}  # no base weight, not even the tied head

    with pytest.raises(ValueError, match=r"holds LoRA adapters of rank 4 .* trainer.lora.rank = 0"):
        load_checkpoint(folder, {"actor": build_actor(tiny_model_dir)})


def test_activation_checkpointing_gives_the_same_step(tiny_model_dir):
    """Checkpointed blocks recompute under a frozen base (inputs that need no grad): the adapters
    must still get the same update."""
    batch = make_batch()
    plain, checkpointed = lora_actor(tiny_model_dir), lora_actor(tiny_model_dir, activation_checkpointing="full")
    update_policy(plain, batch)
    update_policy(checkpointed, batch)
    a, b, start = _params(plain), _params(checkpointed), _params(lora_actor(tiny_model_dir))
    assert any(not torch.equal(a[n], start[n]) for n in a if ".lora_B" in n)  # the step moved them
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7)
