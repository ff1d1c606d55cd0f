"""Temperature scaling of an eagle3 draft's confidence (draftwheel.training.confidence), on chains whose
logits and agreement are set by hand: an overconfident draft gets a temperature above 1, an
underconfident one below, and too little evidence leaves it at 1."""

from __future__ import annotations

import pytest
import torch

from draftwheel.training import confidence

VOCAB, K = 8, 2


class FakeDraft(torch.nn.Module):
    """Just what fit_temperature reads of a draft: the vocabulary map and a parameter's device."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(1, 1)
        self.register_buffer("draft_to_target", torch.arange(VOCAB))


def chains(n: int, margin: float, agree_every: int):
    """One row of n positions: every step's argmax is token 0 with logit `margin` over the others; the
    target's greedy token is 0 at every `agree_every`-th position, else 1."""
    logits = torch.zeros(1, n, VOCAB)
    logits[..., 0] = margin
    reference = torch.tensor([[0 if i % agree_every == 0 else 1 for i in range(n + K)]])
    batch = {"input_ids": torch.zeros(1, n, dtype=torch.long), "aux": None, "argmax": reference,
             "mask": torch.ones(1, n + K, dtype=torch.bool)}
    return [logits.clone() for _ in range(K)], batch


def fit(monkeypatch, n: int, margin: float, agree_every: int) -> dict[str, float]:
    step_logits, batch = chains(n, margin, agree_every)
    monkeypatch.setattr(confidence, "unroll", lambda draft, ids, aux, k: step_logits)
    return confidence.fit_temperature(FakeDraft(), [0], K, collate=lambda rows: batch)


def test_an_overconfident_draft_is_cooled_until_its_confidence_meets_its_agreement(monkeypatch):
    # top-1 probability at T = 1: e^6 / (e^6 + 7) = 0.98. The target agrees at every other position, so
    # a chain's first step agrees half the time and its second (reached only after an agreeing first)
    # never: a third of the positions reached
    result = fit(monkeypatch, 400, margin=6.0, agree_every=2)
    assert result["confidence_temperature"] > 1.0
    assert result["confidence_before"] == pytest.approx(0.983, abs=1e-3)
    assert result["agreement"] == pytest.approx(1 / 3, abs=0.01)
    assert abs(result["confidence_after"] - result["agreement"]) < 0.1  # the nearest temperature on the grid
    assert result["nll_after"] < result["nll_before"]


def test_an_underconfident_draft_is_sharpened(monkeypatch):
    # top-1 probability at T = 1: e^1 / (e^1 + 7) = 0.28; the target always agrees
    result = fit(monkeypatch, 400, margin=1.0, agree_every=1)
    assert result["confidence_temperature"] < 1.0
    assert result["confidence_after"] > result["confidence_before"]


def test_too_few_chain_positions_leave_the_temperature_at_one(monkeypatch):
    result = fit(monkeypatch, 10, margin=6.0, agree_every=2)
    assert result["positions"] < confidence.MIN_POSITIONS
    assert result["confidence_temperature"] == 1.0 and result["nll_after"] == result["nll_before"]
    assert "1.00" in confidence.describe(result)
