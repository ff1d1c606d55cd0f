"""Shared tiny fixtures: a toy target/student pair (untied heads, so greedy outputs are diverse) and the
mined-style datasets built from the target's own greedy completions (distill/, holdout/, preference/)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftwheel.serving import testing as toy

PROMPTS = ["def add(a, b):", "The quick brown fox", "Hello! How can I help", "To be, or not to be",
           "class Stack:", "Please write a short poem", "import os", "Speculative decoding drafts"]


@pytest.fixture(autouse=True)
def _state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="session")
def toy_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("toy_models")
    tokenizer = toy.build_tokenizer()
    target = toy.tiny_llama(tokenizer, n_layers=2, hidden=64, seed=0, tie_embeddings=False)
    student = toy.tiny_llama(tokenizer, n_layers=1, hidden=64, seed=1, tie_embeddings=False)
    return {"target": toy.save_model(target, tokenizer, root / "target"),
            "student": toy.save_model(student, tokenizer, root / "student")}


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory, toy_models) -> dict[str, Path]:
    """distill/ (with stored teacher top-k) + holdout/ from target traffic, and a preference/ set."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftwheel.training.target_completions import save_rows, save_traffic, target_traffic

    root = tmp_path_factory.mktemp("toy_data")
    tokenizer = AutoTokenizer.from_pretrained(toy_models["target"])
    target = AutoModelForCausalLM.from_pretrained(toy_models["target"]).eval()
    workload = [{"prompt": p, "slice": "code" if i % 2 == 0 else "chat"} for i, p in enumerate(PROMPTS)]
    rows = target_traffic(target, tokenizer, workload, max_new_tokens=12, batch_size=4, top_k=8, progress=False)
    paths = save_traffic(rows, rows[:4], root)
    generator = torch.Generator().manual_seed(0)
    pairs = []
    for row in rows:
        chosen = row["completion_token_ids"][0]
        rejected = int(torch.randint(3, len(tokenizer), (1,), generator=generator))
        rejected = rejected if rejected != chosen else rejected + 1
        pairs.append({"prompt": row["prompt"], "chosen": tokenizer.decode([chosen]),
                      "rejected": tokenizer.decode([rejected]), "prompt_token_ids": row["prompt_token_ids"],
                      "chosen_token_ids": [chosen], "rejected_token_ids": [rejected], "slice": row["slice"]})
    paths["preference"] = save_rows(pairs, root / "preference")
    return paths
