"""Distillation smoke tests on toy models: loss goes down, LoRA merges, cached == online teacher."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from draftwheel.config import ConfigError, load_config
from draftwheel.training import losses
from draftwheel.training.data import DatasetError, DistillCollator, join_and_truncate, load_dataset_dir, loss_mask_for, \
    tokenize_distill
from draftwheel.training.distill import DistillConfig, main, on_policy_batch, train_distill


def _mean_fkl(model_dir, target_dir, distill_dir) -> float:
    """Forward KL of a saved student against the target on the training completions."""
    student = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    batch = DistillCollator(0)(list(tokenize_distill(load_dataset_dir(distill_dir, ()), 64)))
    with torch.no_grad():
        s = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        t = target(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return losses.forward_kl(s, t, batch["loss_mask"]).item()


def _config(toy_models, toy_data, tmp_path, **overrides) -> DistillConfig:
    base = dict(student=str(toy_models["student"]), target=str(toy_models["target"]),
                dataset=str(toy_data["distill"]), holdout=str(toy_data["holdout"]), output_dir=str(tmp_path / "out"),
                learning_rate=3e-3, max_steps=12, batch_size=4, logging_steps=4, tracking=False,
                teacher_mode="online", freeze_embeddings=True,
                # These tests check the optimisation itself; epoch selection is tested in test_evaluate.py.
                keep_best_epoch=False, early_stop_patience=0)
    return DistillConfig(**{**base, **overrides})


def test_full_finetune_overfits_and_saves_a_servable_dir(toy_models, toy_data, tmp_path):
    out = train_distill(_config(toy_models, toy_data, tmp_path, loss="tvd"))
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    info = json.loads((out / "draftwheel_training.json").read_text())
    assert info["stage"] == "distill" and info["config"]["loss"] == "tvd"
    assert info["metrics"]["train_tokens_per_s"] > 0
    before = _mean_fkl(toy_models["student"], toy_models["target"], toy_data["distill"])
    after = _mean_fkl(out, toy_models["target"], toy_data["distill"])
    assert after < 0.7 * before, (before, after)
    # Frozen shared embeddings/head are unchanged; the decoder layer moved.
    start = AutoModelForCausalLM.from_pretrained(toy_models["student"])
    trained = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(start.lm_head.weight, trained.lm_head.weight)
    assert torch.equal(start.model.embed_tokens.weight, trained.model.embed_tokens.weight)
    assert not torch.equal(start.model.layers[0].mlp.up_proj.weight, trained.model.layers[0].mlp.up_proj.weight)
    # Agreement was evaluated before training (epoch 0) and after each epoch.
    history = info["eval_history"]
    assert history[0]["epoch"] == 0.0 and len(history) >= 2
    assert history[-1]["agreement"] > history[0]["agreement"]


def test_lora_is_merged_into_plain_weights(toy_models, toy_data, tmp_path):
    out = train_distill(_config(toy_models, toy_data, tmp_path, lora=True, lora_r=4, max_steps=4))
    with safe_open(str(out / "model.safetensors"), "pt") as handle:
        keys = list(handle.keys())
    assert keys and not any("lora" in k for k in keys)
    start = AutoModelForCausalLM.from_pretrained(toy_models["student"])
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not torch.equal(start.model.layers[0].self_attn.q_proj.weight, merged.model.layers[0].self_attn.q_proj.weight)
    assert _mean_fkl(out, toy_models["target"], toy_data["distill"]) < _mean_fkl(
        toy_models["student"], toy_models["target"], toy_data["distill"])


def test_cached_teacher_with_full_vocab_matches_online(toy_models, toy_data, tmp_path):
    vocab = AutoModelForCausalLM.from_pretrained(toy_models["target"]).config.vocab_size
    common = dict(max_steps=1, batch_size=8, holdout="")
    online = train_distill(_config(toy_models, toy_data, tmp_path / "a", teacher_mode="online", **common))
    # A disk cache built by a teacher forward pass (the dataset's own stored top-k is only 8 wide,
    # so it is dropped here to exercise the forward-pass cache).
    from datasets import load_from_disk
    plain = load_from_disk(str(toy_data["distill"])).remove_columns(["teacher_topk_values", "teacher_topk_indices"])
    plain.save_to_disk(str(tmp_path / "plain" / "distill"))
    cached = train_distill(_config(toy_models, toy_data, tmp_path / "b", teacher_mode="cached", top_k=vocab,
                                   dataset=str(tmp_path / "plain" / "distill"), **common))
    assert (tmp_path / "plain" / "teacher_cache").is_dir()
    loss = [json.loads((d / "draftwheel_training.json").read_text())["metrics"]["train_loss"] for d in (online, cached)]
    assert loss[0] == pytest.approx(loss[1], rel=1e-4)


def test_stored_teacher_topk_is_aligned_with_completion_tokens(toy_data):
    encoded = tokenize_distill(load_dataset_dir(toy_data["distill"], ()), 64, with_teacher=True)
    for row in encoded:
        for t, counted in enumerate(row["loss_mask"]):
            if counted:  # greedy traffic: the target's top-1 at t is the next token
                assert row["teacher_topk_indices"][t][0] == row["input_ids"][t + 1]


def test_prompt_loss_counts_every_position_with_a_next_token(toy_data):
    row = tokenize_distill(load_dataset_dir(toy_data["distill"], ()), 64, prompt_loss=True)[0]
    assert row["loss_mask"] == [1] * (len(row["input_ids"]) - 1) + [0]


def test_loss_mask_covers_completion_tokens_only():
    ids, prompt_len = join_and_truncate([1, 2, 3], [4, 5], max_length=10)
    assert ids == [1, 2, 3, 4, 5] and prompt_len == 3
    assert loss_mask_for(len(ids), prompt_len) == [0, 0, 1, 1, 0]  # logits at 2 and 3 predict 4 and 5
    ids, prompt_len = join_and_truncate(list(range(10)), [20, 21, 22], max_length=8)
    assert ids == [5, 6, 7, 8, 9, 20, 21, 22] and prompt_len == 5  # prompt cut from the left


def test_config_validation_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="loss"):
        DistillConfig(loss="l2")
    with pytest.raises(ValueError, match="teacher_mode"):
        DistillConfig(teacher_mode="sometimes")
    with pytest.raises(ValueError, match="learning_rate"):
        DistillConfig(learning_rate=0)
    with pytest.raises(ValueError, match="lora_r"):
        DistillConfig(lora=True, lora_r=0)
    with pytest.raises(ConfigError, match="lossy"):
        load_config(DistillConfig, "configs/distill.yaml", ["lossy=fkl"])
    assert load_config(DistillConfig, "configs/distill.yaml", ["loss=jsd"]).loss == "jsd"


def test_missing_dataset_and_columns_raise(toy_models, toy_data, tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        train_distill(_config(toy_models, toy_data, tmp_path, dataset=str(tmp_path / "nope")))
    with pytest.raises(DatasetError, match="completion_token_ids"):
        train_distill(_config(toy_models, toy_data, tmp_path, dataset=str(toy_data["preference"])))


def test_module_entry_point_runs_with_config_and_overrides(toy_models, toy_data, tmp_path, capsys):
    assert main(["--config", "configs/distill.yaml", f"student={toy_models['student']}",
                 f"target={toy_models['target']}", f"dataset={toy_data['distill']}", "holdout=",
                 f"output_dir={tmp_path / 'cli'}", "max_steps=2", "tracking=false"]) == 0
    assert str(tmp_path / "cli") in capsys.readouterr().out
    assert (tmp_path / "cli" / "model.safetensors").is_file()


def test_on_policy_batch_keeps_prompts_and_lets_the_student_write(toy_models, toy_data):
    torch.manual_seed(0)
    student = AutoModelForCausalLM.from_pretrained(toy_models["student"]).eval()
    rows = list(tokenize_distill(load_dataset_dir(toy_data["distill"], ()), 64))[:3]
    batch = on_policy_batch(student, DistillCollator(0)(rows), pad_id=0)
    for i, row in enumerate(rows):
        prompt_len = row["loss_mask"].index(1) + 1
        n = int(batch["attention_mask"][i].sum())
        assert batch["input_ids"][i, :prompt_len].tolist() == row["input_ids"][:prompt_len]
        assert 1 <= n - prompt_len <= sum(row["loss_mask"])
        assert int(batch["loss_mask"][i].sum()) == n - prompt_len


def test_on_policy_training_runs_with_an_online_teacher(toy_models, toy_data, tmp_path):
    out = train_distill(_config(toy_models, toy_data, tmp_path, on_policy_fraction=1.0, max_steps=2, holdout=""))
    assert json.loads((out / "draftwheel_training.json").read_text())["metrics"]["train_loss"] > 0
    with pytest.raises(ValueError, match="on_policy_fraction"):
        DistillConfig(on_policy_fraction=0.5, teacher_mode="cached")
