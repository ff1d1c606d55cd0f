"""The as-served cost model (draftwheel.evaluation.served_cost) on hand-built steps, and the measured row costs on a toy target.

A plain step (k = 0) costs exactly one unit and emits one token, so plain decoding is 1.0 by construction;
a step verifying k drafted tokens costs row_costs[k] plus c per token a draft model drafted, and emits
accepted + 1 tokens. The suffix index's proposals cost nothing beyond their verify rows.
"""

from __future__ import annotations

import pytest

from draftwheel.serving import testing as toy
from draftwheel.serving.engine.records import Beside, Step, verify_rows
from draftwheel.evaluation.served_cost import StepCost, draft_c, measure_row_costs, served_speedup

ROWS = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]


def step(k: int, accepted: int, source: str | None) -> Step:
    return Step(k=k, accepted=accepted, draft_token_ids=[0] * k, target_token_id=0, source=source)


def test_plain_decoding_is_one():
    cost = StepCost.of([step(0, 0, None)] * 10, ROWS, "hybrid")
    assert (cost.tokens, cost.verify_cost, cost.model_drafted) == (10, 10.0, 0)
    assert served_speedup(cost, c=0.3) == 1.0


def test_a_copied_span_costs_its_rows_only_and_a_model_chain_adds_c_per_token():
    suffix = StepCost.of([step(5, 5, "suffix")], ROWS, "hybrid")  # 6 tokens for one 6-row verify
    assert served_speedup(suffix, c=0.5) == pytest.approx(6 / 1.5)
    model = StepCost.of([step(4, 2, "eagle3")], ROWS, "hybrid")  # 3 tokens for a 5-row verify and 4 drafted
    assert served_speedup(model, c=0.1) == pytest.approx(3 / (1.4 + 0.4))
    # mode draft records from older writers have no per-step source: every drafted step is the model's
    assert StepCost.of([step(4, 2, None)], ROWS, "draft").model_drafted == 4
    assert StepCost.of([step(4, 2, None)], ROWS, "hybrid").model_drafted == 0


def test_a_draft_that_is_always_rejected_is_slower_than_plain():
    cost = StepCost.of([step(4, 0, "eagle3")] * 8, ROWS, "draft")
    assert served_speedup(cost, c=0.05) < 1.0


def test_a_token_tree_costs_both_proposals_rows_and_the_chains_drafting():
    chain = Beside(k=3, accepted=0, draft_token_ids=[7, 8, 9], source="eagle3")
    # the index's branch won (2 of [5, 6] then the target's token); the chain beside it shared nothing
    won = Step(k=2, accepted=2, draft_token_ids=[5, 6], target_token_id=0, source="suffix", beside=chain)
    assert verify_rows(won) == 6
    cost = StepCost.of([won], ROWS, "hybrid")
    assert (cost.tokens, cost.verify_cost, cost.model_drafted) == (3, ROWS[5], 3)
    shared = Step(k=3, accepted=1, draft_token_ids=[5, 8, 9], target_token_id=0, source="eagle3",
                  beside=Beside(k=2, accepted=1, draft_token_ids=[5, 6], source="suffix"))
    assert verify_rows(shared) == 5  # the shared 5 is one row
    assert StepCost.of([shared], ROWS, "hybrid").model_drafted == 3


def test_a_runner_up_branch_costs_its_row_but_no_drafting():
    """The draft's runner-up first token beside its own chain: one more verify row, and no draft forward
    beyond the chain's, whichever of the two won."""
    chain = Beside(k=3, accepted=0, draft_token_ids=[7, 8, 9], source="eagle3")
    won = Step(k=1, accepted=1, draft_token_ids=[4], target_token_id=0, source="eagle3", beside=chain)
    assert verify_rows(won) == 5
    assert StepCost.of([won], ROWS, "hybrid").model_drafted == 3
    lost = Step(k=3, accepted=2, draft_token_ids=[7, 8, 9], target_token_id=0, source="eagle3",
                beside=Beside(k=1, accepted=0, draft_token_ids=[4], source="eagle3"))
    assert StepCost.of([lost], ROWS, "draft").model_drafted == 3


def test_longer_steps_than_measured_take_the_longest_measured_cost():
    assert StepCost.of([step(16, 16, "suffix")], ROWS, "hybrid").verify_cost == ROWS[-1]


def test_draft_c_reads_the_plain_step_off_the_same_requests_verify_forwards():
    # 100 drafted tokens in 2 s; 10 s of verify forwards that cost 50 plain steps: a plain step is 0.2 s
    assert draft_c(2.0, 100, 10.0, 50.0) == pytest.approx(0.1)
    # twice the load on both (drafting and verifying alternate): the same c
    assert draft_c(4.0, 100, 20.0, 50.0) == pytest.approx(0.1)
    assert draft_c(2.0, 0, 10.0, 50.0) == 0.0  # nothing drafted: no c to measure
    assert draft_c(2.0, 100, 0.0, 0.0) == 0.0  # nothing timed


def test_measured_row_costs_start_at_one_and_never_fall():
    tokenizer = toy.build_tokenizer()
    costs, one_row_s = measure_row_costs(toy.tiny_llama(tokenizer, n_layers=1, seed=0), 6, context=16, reps=2)
    assert len(costs) == 6 and costs[0] == 1.0 and one_row_s > 0
    assert all(b >= a for a, b in zip(costs, costs[1:]))
