"""Medusa heads: identity init, independent heads, save/load, training, and lossless greedy decoding."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from draftwheel.config import load_config
from draftwheel.serving import testing as toy
from draftwheel.serving.engine.medusa import MedusaHeads, is_medusa_dir
from draftwheel.training.medusa_train import MedusaConfig, head_masks, train_medusa


@pytest.fixture(scope="module")
def target():
    tokenizer = toy.build_tokenizer()
    return toy.tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)


def test_fresh_heads_are_identity_blocks_on_the_shared_frozen_head(target):
    heads = MedusaHeads.for_target(target, n_heads=3)
    ids = torch.randint(0, target.config.vocab_size, (2, 5))
    out = target(ids, output_hidden_states=True)
    logits = heads(out.hidden_states[-1])
    assert logits.shape == (3, 2, 5, target.config.vocab_size)
    for i in range(3):  # every head starts out predicting what the target predicts
        assert torch.allclose(logits[i], out.logits, atol=1e-5)
    assert heads.lm_head is target.lm_head and not target.lm_head.weight.requires_grad
    assert all(p.requires_grad for p in heads.trainable_parameters())


def test_heads_do_not_share_weights(target):
    heads = MedusaHeads.for_target(target, n_heads=3)
    assert len({id(block) for block in heads.blocks}) == 3
    with torch.no_grad():
        heads.blocks[0][0].linear.weight.fill_(1.0)
    assert heads.blocks[1][0].linear.weight.abs().sum() == 0


def test_save_load_roundtrip_and_hidden_size_check(target, tmp_path):
    heads = MedusaHeads.for_target(target, n_heads=2, n_layers=2, target_sha256="abc")
    with torch.no_grad():
        for p in heads.trainable_parameters():
            p.normal_()
    heads.save(tmp_path / "heads")
    assert is_medusa_dir(tmp_path / "heads") and not is_medusa_dir(tmp_path)
    loaded = MedusaHeads.load(tmp_path / "heads", target)
    assert loaded.config_dict() == heads.config_dict()
    hidden = torch.randn(1, 3, target.config.hidden_size)
    assert torch.equal(loaded(hidden), heads(hidden))
    other = toy.tiny_llama(toy.build_tokenizer(), n_layers=1, hidden=32, seed=0)
    with pytest.raises(ValueError, match="hidden_size"):
        MedusaHeads.load(tmp_path / "heads", other)
    with pytest.raises(ValueError, match="n_heads"):
        MedusaHeads(8, 0, target.lm_head)


def test_head_masks_shift_by_head_index():
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 0]], dtype=torch.bool)  # tokens 3, 4, 5 are completion
    masks = head_masks(loss_mask, 2)
    # head 0 at t predicts t + 2: t = 1, 2, 3; head 1 predicts t + 3: t = 0, 1, 2
    assert masks[0].tolist() == [[False, True, True, True, False, False]]
    assert masks[1].tolist() == [[True, True, True, False, False, False]]


def test_train_medusa_improves_heads_and_decodes_losslessly(toy_models, toy_data, tmp_path):
    from draftwheel.serving.loading import engine_from_specs
    from draftwheel.serving.engine.params import SamplingParams

    config = MedusaConfig(target=str(toy_models["target"]), dataset=str(toy_data["distill"]),
                          holdout=str(toy_data["holdout"]), output_dir=str(tmp_path / "heads"), n_heads=2,
                          loss="ce", learning_rate=1e-2, max_steps=15, batch_size=8, tracking=False)
    out = train_medusa(config)
    assert is_medusa_dir(out)
    metrics = json.loads((out / "draftwheel_training.json").read_text())["metrics"]
    assert metrics["eval_head0_accuracy"] > metrics["before_head0_accuracy"]
    assert metrics["eval_chain_mean_accepted_length"] > metrics["before_chain_mean_accepted_length"]
    engine = engine_from_specs(toy_models["target"], medusa=out)
    target = AutoModelForCausalLM.from_pretrained(toy_models["target"]).eval()
    completions = engine.generate(["def add(a, b):", "The quick brown fox"], SamplingParams(max_new_tokens=12, k=2),
                                  chat=True, mode="medusa")
    for completion in completions:
        ids = torch.tensor([completion.prompt_token_ids])
        expected = target.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
        assert completion.token_ids == expected[:len(completion.token_ids)]
    assert sum(c.record.accepted_tokens for c in completions) > 0  # the trained heads' guesses get accepted


def test_medusa_config_validation():
    with pytest.raises(ValueError, match="n_heads"):
        MedusaConfig(n_heads=0)
    with pytest.raises(ValueError, match="loss"):
        MedusaConfig(loss="mse")
    with pytest.raises(ValueError, match="head_decay"):
        MedusaConfig(head_decay=0)
    assert load_config(MedusaConfig, "configs/medusa.yaml").n_heads == 3
