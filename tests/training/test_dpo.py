"""DPO smoke test: a few LoRA steps on accept/reject pairs raise the chosen-vs-rejected margin."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from draftwheel.config import load_config
from draftwheel.training.data import DatasetError, load_dataset_dir
from draftwheel.training.dpo import DpoConfig, train_dpo


def _margin(model_dir, pairs) -> float:
    """Mean log p(chosen) - log p(rejected) at the end of each prompt."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total = 0.0
    with torch.no_grad():
        for row in pairs:
            logprobs = model(torch.tensor([row["prompt_token_ids"]])).logits[0, -1].log_softmax(-1)
            total += float(logprobs[row["chosen_token_ids"][0]] - logprobs[row["rejected_token_ids"][0]])
    return total / len(pairs)


def test_dpo_lora_raises_the_preference_margin_and_saves_merged(toy_models, toy_data, tmp_path):
    config = DpoConfig(student=str(toy_models["student"]), target=str(toy_models["target"]),
                       dataset=str(toy_data["preference"]), holdout=str(toy_data["holdout"]),
                       output_dir=str(tmp_path / "dpo"), lora=True, lora_r=4, learning_rate=5e-3, max_steps=8,
                       batch_size=8, beta=0.1, tracking=False, logging_steps=2)
    out = train_dpo(config)
    with safe_open(str(out / "model.safetensors"), "pt") as handle:
        assert not any("lora" in key for key in handle.keys())
    pairs = load_dataset_dir(toy_data["preference"], ())
    assert _margin(out, pairs) > _margin(toy_models["student"], pairs) + 0.1
    info = json.loads((out / "draftwheel_training.json").read_text())
    assert info["stage"] == "dpo" and info["target_sha256"]
    assert info["eval_history"][0]["epoch"] == 0.0


def test_dpo_needs_token_id_columns(toy_models, toy_data, tmp_path):
    config = DpoConfig(student=str(toy_models["student"]), dataset=str(toy_data["distill"]),
                       output_dir=str(tmp_path / "x"), tracking=False)
    with pytest.raises(DatasetError, match="chosen_token_ids"):
        train_dpo(config)


def test_dpo_config_validation():
    with pytest.raises(ValueError, match="beta"):
        DpoConfig(beta=0)
    with pytest.raises(ValueError, match="batch_size"):
        DpoConfig(batch_size=0)
    assert load_config(DpoConfig, "configs/dpo.yaml").lora is True
