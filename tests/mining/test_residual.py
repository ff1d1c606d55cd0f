"""The served residual on hand-built records: copied spans weigh nothing, missed spans fully."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from draftwheel.mining.residual import served_residual, served_share
from draftwheel.serving.engine.records import Step


def record(steps: list[Step], n_output: int) -> SimpleNamespace:
    return SimpleNamespace(steps=steps, output_token_ids=list(range(n_output)), mode="hybrid")


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
