"""The batched greedy loop behind target completions and continuations (draftwheel.training.target_completions):
rows of one batch end at different steps (their own limit, or an EOS) and leave the batch then; every
row must still get exactly the target's own greedy tokens, and the hidden states of what it was fed."""

from __future__ import annotations

import pytest
import torch

from draftwheel.serving.loading import load_model
from tests.serving.test_engine import hf_greedy
from draftwheel.training.target_completions import _decode_batch, greedy_continuations

SEQUENCES = [[1, 5, 9, 13], [2, 7], [3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13]]


@pytest.fixture(scope="module")
def target(toy_models):
    return load_model(toy_models["target"])


def test_each_row_gets_the_targets_greedy_tokens_up_to_its_own_limit(target):
    limits = [1, 6, 3, 9]  # rows leave the batch after 1, 3 and 6 steps; the last decodes alone
    got = greedy_continuations(target.model, target.tokenizer, SEQUENCES, limits, batch_size=4, progress=False)
    for seq, limit, tokens in zip(SEQUENCES, limits, got):
        assert tokens == hf_greedy(target.model, seq, limit)
    assert [len(t) for t in got] == limits  # the toy target's greedy answers here reach no EOS
    with pytest.raises(ValueError, match="limits"):
        _decode_batch(target.model, SEQUENCES, 0, set(), [4, 0, 4, 4])


def test_a_row_stops_at_its_eos_with_the_eos_fed_for_its_states(target):
    """Declare the 3rd greedy token of row 0 an EOS: row 0 ends there (EOS included) while the others go
    on, and with states kept the EOS is fed once more, so its position has states; a row that ends at
    its limit was not fed its last token. The states equal a teacher-forced forward over the same tokens."""
    free = hf_greedy(target.model, SEQUENCES[0], 6)
    eos = {free[2]}
    assert all(t not in eos for seq in SEQUENCES[1:] for t in hf_greedy(target.model, seq, 6)), "pick another EOS"
    layers = [1, -1]
    rows = _decode_batch(target.model, SEQUENCES, 0, eos, [6] * 4, layers=layers)
    assert rows[0]["tokens"] == free[:3]
    for seq, row in zip(SEQUENCES, rows):
        fed = seq + (row["tokens"] if row["tokens"][-1] in eos else row["tokens"][:-1])
        assert [s.shape[0] for s in row["states"]] == [len(fed)] * len(layers)
        with torch.no_grad():
            forward = target.model(torch.tensor([fed]), output_hidden_states=True).hidden_states
        for layer, states in zip(layers, row["states"]):
            torch.testing.assert_close(states, forward[layer][0], atol=1e-4, rtol=1e-4)
    assert all(len(row["tokens"]) == 6 for row in rows[1:])
    alone = _decode_batch(target.model, SEQUENCES, 0, eos, [6] * 4)  # no states: the EOS is not fed
    assert [r["tokens"] for r in alone] == [r["tokens"] for r in rows] and alone[0]["states"] is None


def test_logits_are_the_ones_each_token_was_picked_from(target):
    rows = _decode_batch(target.model, SEQUENCES, 0, set(), [2, 5, 3, 4], logits=True)
    for row in rows:
        assert row["logits"].shape == (len(row["tokens"]), target.model.config.vocab_size)
        assert row["logits"].argmax(-1).tolist() == row["tokens"]


def test_sampled_rows_are_seeded_and_follow_the_targets_law(target):
    """With a temperature the rows are draws, the same for the same generator seed; at a temperature near
    0 they are the greedy tokens, and one step's draws over many rows follow softmax(logits / T)."""
    def sample(seed, temperature=1.0, sequences=SEQUENCES, limit=6):
        return [r["tokens"] for r in _decode_batch(target.model, sequences, 0, set(), [limit] * len(sequences),
                                                   temperature=temperature,
                                                   generator=torch.Generator().manual_seed(seed))]

    assert sample(1) == sample(1) and sample(1) != sample(2)
    assert sample(1, temperature=1e-4) == [r["tokens"] for r in _decode_batch(target.model, SEQUENCES, 0, set(), [6] * 4)]
    many = [SEQUENCES[1]] * 400
    first = torch.tensor([t[0] for t in sample(3, sequences=many, limit=1)])
    with torch.no_grad():
        law = torch.softmax(target.model(torch.tensor([SEQUENCES[1]])).logits[0, -1].float(), -1)
    top = law.topk(3).indices
    for token in top.tolist():  # the likeliest tokens' frequencies, each within 5 standard errors of its law
        p, freq = float(law[token]), float((first == token).float().mean())
        assert abs(freq - p) <= 5 * (p * (1 - p) / len(many)) ** 0.5 + 1e-9, (token, freq, p)
