"""`metrics.speculative_decoding` in vLLM's shape: built from a record, read back with its counts checked."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from draftwheel.serving.engine.records import Step
from draftwheel.serving.server.spec_metrics import from_record, reported_counts
from tests.serving.vllm_fixtures import SPEC


def _record(steps: list[tuple[int, int]]) -> SimpleNamespace:
    """What `from_record` reads of a record: its steps, (k, accepted) each."""
    return SimpleNamespace(steps=[Step(k=k, accepted=a, draft_token_ids=[5] * k, target_token_id=6) for k, a in steps])


def test_the_block_counts_speculative_steps_as_vllm_does():
    # two 4-token drafts (3 and 4 accepted), a 2-token one (0 accepted), and a plain step (k=0): vLLM leaves
    # steps with nothing drafted out, so 3 speculative steps, 10 drafted, 7 accepted.
    block = from_record(_record([(4, 3), (0, 0), (4, 4), (2, 0)]), num_spec_tokens=4)
    assert block["num_spec_steps"] == 3 and block["num_draft_tokens"] == 10
    assert block["num_accepted_draft_tokens"] == 7
    assert block["mean_acceptance_length"] == pytest.approx(1 + 7 / 3)  # bonus token included
    assert block["draft_acceptance_rate"] == pytest.approx(7 / 10)
    assert block["num_spec_tokens"] == 4
    assert block["acceptance_histogram"] == [1, 0, 0, 1, 1]  # dense, num_spec_tokens + 1 long
    assert block["acceptance_histogram_by_draft_length"] == {"2": [1, 0, 0], "4": [0, 0, 0, 1, 1]}
    assert "per_step_accepted" not in block
    detailed = from_record(_record([(4, 3), (0, 0), (4, 4), (2, 0)]), 4, detailed=True)
    assert detailed["per_step_accepted"] == [3, 4, 0] and detailed["per_step_drafted"] == [4, 4, 2]
    assert reported_counts(block).drafted == 10  # what the server sends, the proxy reads back


def test_a_step_longer_than_k_widens_the_histogram_and_nothing_drafted_gives_zeros():
    block = from_record(_record([(6, 6)]), num_spec_tokens=4)  # a suffix-index proposal longer than k
    assert block["num_spec_tokens"] == 6 and len(block["acceptance_histogram"]) == 7
    empty = from_record(_record([(0, 0), (0, 0)]), num_spec_tokens=4)
    assert empty["num_spec_steps"] == 0 and empty["acceptance_histogram"] == [0] * 5
    assert empty["mean_acceptance_length"] == 0.0 and empty["draft_acceptance_rate"] == 0.0


def test_vllms_documented_example_reads_back():
    counts = reported_counts(SPEC)
    assert (counts.drafted, counts.accepted, counts.steps) == (129, 10, 43)
    assert math.isclose(SPEC["mean_acceptance_length"], 1 + counts.accepted / counts.steps)
    # an earlier vLLM shape: the histogram as a sparse {"j": steps} map
    assert reported_counts({**SPEC, "acceptance_histogram": {"0": 39, "1": 1, "3": 3}}) == counts


@pytest.mark.parametrize("change, field", [
    ({"num_draft_tokens": None}, "num_draft_tokens"),
    ({"num_spec_steps": -1}, "num_spec_steps"),
    ({"num_accepted_draft_tokens": True}, "num_accepted_draft_tokens"),
    ({"num_accepted_draft_tokens": 200}, "num_accepted_draft_tokens=200 > num_draft_tokens"),
    ({"num_spec_steps": 0, "acceptance_histogram": None}, "num_spec_steps=0"),
    ({"acceptance_histogram": [40, 1, 0, 3]}, "acceptance_histogram"),
    ({"acceptance_histogram": ["39"]}, "acceptance_histogram"),
])
def test_inconsistent_figures_are_refused_naming_the_field(change, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        reported_counts({**SPEC, **change})
    with pytest.raises(ValueError, match="expected an object"):
        reported_counts([1, 2])
