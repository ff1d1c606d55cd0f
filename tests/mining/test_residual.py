"""The served residual on hand-built records: copied spans weigh nothing, missed spans fully."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from draftwheel.mining.residual import served_residual, served_share
from draftwheel.serving.engine.records import Step


def record(steps: list[Step], n_output: int, accepted: int | None = None, verify_steps: int | None = None
           ) -> SimpleNamespace:
    """A record's fields the residual reads; the totals are the steps' unless given (another engine's)."""
    return SimpleNamespace(steps=steps, output_token_ids=list(range(n_output)), mode="hybrid",
                           accepted_tokens=sum(s.accepted for s in steps) if accepted is None else accepted,
                           verify_steps=len(steps) if verify_steps is None else verify_steps)


def step(k: int, accepted: int, source: str | None) -> Step:
    return Step(k=k, accepted=accepted, draft_token_ids=[0] * k, target_token_id=0, source=source)


def test_a_copied_span_gets_no_weight_and_a_span_both_missed_gets_full_weight():
    # prefill token, a 6-token suffix copy with its bonus, then the draft rejected at once, then a plain step
    rec = record([step(6, 6, "suffix"), step(4, 0, "eagle3"), step(0, 0, None)], 1 + 7 + 1 + 1)
    assert served_residual(rec) == [1.0] + [0.0] * 6 + [1.0] + [1.0] + [1.0]
    assert served_share(rec) == pytest.approx(6 / 10)


def test_a_rejected_suffix_proposal_and_a_partly_accepted_chain():
    rec = record([step(8, 0, "suffix"), step(4, 2, "eagle3")], 1 + 1 + 3)
    assert served_residual(rec) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_output_cut_by_a_stop_string_and_records_without_steps():
    assert served_residual(record([step(4, 4, "suffix")], 3)) == [1.0, 0.0, 0.0]
    assert served_residual(record([], 4)) == [1.0] * 4
    assert served_share(record([], 0)) == 0.0


def test_a_record_from_another_engine_counts_its_reported_totals():
    # no steps: 12 accepted drafted tokens in 4 verify steps give at least 12 + 4 + 1 output tokens
    assert served_share(record([], 0, accepted=12, verify_steps=4)) == pytest.approx(12 / 17)
    assert served_share(record([], 30, accepted=12, verify_steps=4)) == pytest.approx(12 / 30)
    assert served_residual(record([], 5, accepted=3, verify_steps=1)) == [1.0] * 5  # which ones: unknown


def test_the_loops_that_step_their_first_token_are_aligned_from_it():
    """Mode suffix (and an `lm` draft's hybrid) records the prompt's forward as its first step, and an
    `lm` draft in mode draft verifies its first drafts there: their steps hold the first token. The eagle3
    loop's steps start after it; a hybrid step list with neither mark is told by its token count."""
    def as_mode(mode, steps, n_output):
        rec = record(steps, n_output)
        rec.mode = mode
        return rec

    suffix = as_mode("suffix", [step(0, 0, None), step(3, 3, "suffix"), step(2, 0, "suffix")], 1 + 4 + 1)
    assert served_residual(suffix) == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    lm_draft = as_mode("draft", [step(3, 2, None), step(3, 0, None)], 3 + 1)
    assert served_residual(lm_draft) == [0.0, 0.0, 1.0, 1.0]
    lm_hybrid = as_mode("hybrid", [step(0, 0, None), step(3, 1, "draft"), step(2, 2, "suffix")], 1 + 2 + 3)
    assert served_residual(lm_hybrid) == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    eagle_draft = as_mode("draft", [step(3, 2, "eagle3")], 1 + 3)
    assert served_residual(eagle_draft) == [1.0, 0.0, 0.0, 1.0]
    index_only_hybrid = [step(0, 0, None), step(2, 2, "suffix")]  # which loop: 4 tokens or 5?
    assert served_residual(as_mode("hybrid", index_only_hybrid, 4)) == [1.0, 0.0, 0.0, 1.0]
    assert served_residual(as_mode("hybrid", index_only_hybrid, 5)) == [1.0, 1.0, 0.0, 0.0, 1.0]
