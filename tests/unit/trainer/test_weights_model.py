from __future__ import annotations

import torch

from rlvr.recipe.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from rlvr.tiny import tiny_config
from rlvr.trainer.hf import load_hf_model
from rlvr.trainer.model import build_model, decoder_blocks
from rlvr.trainer.step import update_critic, update_policy
from rlvr.trainer.weights import iter_full_weights, weight_names


def test_weights_iterate_in_hf_naming_without_tied_duplicates(tiny_model_dir):
    from safetensors.torch import load_file

    model = load_hf_model(ModelConfig(path=str(tiny_model_dir)))
    on_disk = load_file(str(tiny_model_dir / "model.safetensors"))
    got = dict(iter_full_weights(model))
    assert list(got) == weight_names(model)
    assert set(got) == set(on_disk)  # the names a transformers/SGLang loader expects
    assert "lm_head.weight" not in got  # tied to the embeddings: sent once
    assert all(torch.equal(got[n], on_disk[n]) for n in got)
    bf16 = dict(iter_full_weights(model, dtype=torch.bfloat16))
    assert bf16["model.norm.weight"].dtype == torch.bfloat16


def test_model_from_config_dict_is_seeded_and_has_blocks():
    cfg = ModelConfig(config=tiny_config(vocab_size=64, hidden_size=32, layers=3))
    a = build_model(cfg, TrainerConfig(strategy="none"), device=torch.device("cpu"), seed=5)
    b = build_model(cfg, TrainerConfig(strategy="none"), device=torch.device("cpu"), seed=5)
    assert len(decoder_blocks(a)) == 3
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    frozen = build_model(cfg, TrainerConfig(strategy="none"), device=torch.device("cpu"), trainable=False)
    assert not any(p.requires_grad for p in frozen.parameters())


def test_activation_checkpointing_gives_the_same_update(tiny_model_dir):
    from rlvr.trainer.actor import Actor

    from .conftest import make_batch

    batch = make_batch()
    grads = []
    for ckpt in (False, True):
        cfg = ModelConfig(path=str(tiny_model_dir), gradient_checkpointing=ckpt)
        actor = Actor.build(
            cfg, TrainerConfig(strategy="none", grad_clip=0.0, lr=1e-2), AlgorithmConfig(preset="grpo"),
            total_steps=1, device=torch.device("cpu"),
        )  # fmt: skip
        assert getattr(actor.model, "is_activation_checkpointing", False) == ckpt
        update_policy(actor, batch)
        grads.append({n: p.detach().clone() for n, p in actor.model.named_parameters()})
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])


def test_critic_learns_the_returns(tiny_model_dir):
    from rlvr.trainer.critic import Critic

    from .conftest import make_batch

    batch = make_batch()
    batch = batch.replace(returns=batch.response_mask * 0.5)
    alg = AlgorithmConfig(preset="ppo", critic_lr=3e-3)
    critic = Critic.build(
        ModelConfig(path=str(tiny_model_dir)), TrainerConfig(strategy="none"), alg, total_steps=30,
        device=torch.device("cpu"),
    )  # fmt: skip
    values = critic.compute_values(batch)
    assert values.shape == batch.response_mask.shape and (values[batch.response_mask == 0] == 0).all()
    first = update_critic(critic, batch)
    for _ in range(15):
        last = update_critic(critic, batch)
    assert {"vf_loss", "vf_clip_frac", "grad_norm", "lr"} <= first.keys()
    assert last["loss"] < 0.2 * first["loss"]
