"""Teacher-forced agreement: the implied-length formula, the greedy replay, and the per-epoch callback."""

from __future__ import annotations

import pytest
import torch

from serving import toy
from training.data import HoldoutExample
from training.evaluate import (AgreementCallback, evaluate_agreement, greedy_replay, implied_mean_accepted_length,
                               target_references)


def test_implied_mean_accepted_length():
    assert implied_mean_accepted_length(0.0, 4) == 1.0
    assert implied_mean_accepted_length(1.0, 4) == 5.0
    assert implied_mean_accepted_length(0.5, 4) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    with pytest.raises(ValueError, match="a must be"):
        implied_mean_accepted_length(1.5, 4)


def test_greedy_replay_by_hand():
    # matches: T T F T T T T T ; k = 3
    # step 1 at 0: accepts 2 (pos 0, 1), rejects pos 2 -> emits 3, next start 3
    # step 2 at 3: accepts 3 (3, 4, 5) -> bonus token at 6, next start 7
    # step 3 at 7: budget 1, accepts 1
    accepted, drafted = greedy_replay([True, True, False, True, True, True, True, True], k=3)
    assert accepted == [2, 3, 1] and drafted == [3, 3, 1]
    assert greedy_replay([], k=3) == ([], [])


def _examples(model, n=3, length=10):
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(n):
        prompt = torch.randint(3, model.config.vocab_size, (5,), generator=generator).tolist()
        ids = list(prompt)
        with torch.no_grad():  # plain argmax decoding (generate() would stop or suppress at EOS)
            for _ in range(length):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        examples.append(HoldoutExample(prompt, ids[5:]))
    return examples


def test_a_model_agrees_with_its_own_greedy_outputs():
    model = toy.tiny_llama(toy.build_tokenizer(), n_layers=1, seed=0, tie_embeddings=False)
    metrics = evaluate_agreement(model, _examples(model), k=4, progress=False)
    assert metrics["agreement"] == 1.0
    assert metrics["replay_acceptance_rate"] == 1.0
    assert metrics["acceptance_pos1"] == metrics["acceptance_pos4"] == 1.0
    # 10 outputs with k = 4: each step accepts 4 and adds the bonus token: 2 steps, (8 + 2) / 2
    assert metrics["replay_mean_accepted_length"] == pytest.approx(5.0)


def test_a_different_model_agrees_less_and_references_come_from_the_target():
    tokenizer = toy.build_tokenizer()
    target = toy.tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    draft = toy.tiny_llama(tokenizer, n_layers=1, seed=5, tie_embeddings=False)
    examples = _examples(target)
    refs = target_references(target, examples, progress=False)
    assert refs == [e.output_ids for e in examples]  # greedy outputs are the target's argmax
    metrics = evaluate_agreement(draft, examples, k=4, references=refs, progress=False)
    assert metrics["agreement"] < 0.5
    assert 1.0 <= metrics["replay_mean_accepted_length"] < 2.5
    with pytest.raises(ValueError, match="k must"):
        evaluate_agreement(draft, examples, k=0)


class _RecordingTracker:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((metrics, step))


def test_callback_logs_each_epoch_via_the_tracker():
    from transformers import TrainerControl, TrainerState, TrainingArguments

    model = toy.tiny_llama(toy.build_tokenizer(), n_layers=1, seed=0, tie_embeddings=False)
    tracker = _RecordingTracker()
    callback = AgreementCallback(_examples(model, n=1), tracker, k=2)
    state = TrainerState()
    state.epoch, state.global_step = 1.0, 7
    callback.on_epoch_end(TrainingArguments(output_dir="unused", report_to=[]), state, TrainerControl(), model=model)
    (metrics, step), = tracker.calls
    assert step == 7 and metrics["eval_agreement"] == 1.0 and metrics["eval_epoch"] == 1.0
    assert callback.history[0]["agreement"] == 1.0
