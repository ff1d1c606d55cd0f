"""The suffix index on hand-built token sequences: proposals, scores, bounds, eviction, per-target keys.

Expected proposals are worked out by hand from SuffixDecoding's rule: among the earlier occurrences of
the context's suffix, follow the most frequent continuation; a token's probability is the product of
the branch fractions `count(continuation) / count(occurrences)` on its path (an occurrence whose
sequence ends counts in the denominator only); the score is the sum over drafted tokens.
"""

from __future__ import annotations

import json
import time

import pytest

from draftwheel.serving.engine.records import AcceptanceRecord, ModelId, Sampling
from draftwheel.serving.engine.suffix import EMPTY, Proposal, ReadOnlyIndex, RequestIndex, SuffixConfig, SuffixIndex, best_proposal, target_key


def index_of(*sequences, **config):
    index = SuffixIndex("t", SuffixConfig(**config))
    for seq in sequences:
        index.add(seq)
    return index


def test_unanimous_continuation_is_proposed_with_probability_one():
    index = index_of([1, 2, 3, 4, 5, 6, 7, 8], [9, 2, 3, 4, 5, 6, 0])
    proposal = index.propose([2, 3, 4], 3)  # both occurrences of (2,3,4) go on 5, 6
    assert proposal.match_len == 3
    # Third token: 7 once, 0 once (tie -> the most recent, 0), probability 1/2.
    assert proposal.tokens == [5, 6, 0] and proposal.score == pytest.approx(1 + 1 + 0.5)


def test_speculation_length_grows_with_match_length():
    index = index_of(list(range(1, 30)))
    for m in (2, 3, 5, 8):
        proposal = index.propose([0] + list(range(10 - m, 10)), 16)  # a context suffix matching m tokens
        assert proposal.match_len == m
        assert proposal.tokens == list(range(10, 10 + m))  # spec_factor 1: m tokens
    assert index.propose(list(range(1, 10)), 4).tokens == [10, 11, 12, 13]  # capped by max_k
    wide = index_of(list(range(1, 30)), spec_factor=2.0, spec_offset=1.0)
    assert len(wide.propose([0, 8, 9], 16).tokens) == 5  # 2 * 2 + 1


def test_branch_frequency_and_min_token_prob():
    # After (1, 2): 3 three times, 4 once -> propose 3 with probability 3/4, then 5 (all three go on to 5).
    index = index_of([1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 4, 6], [1, 2, 3, 5], spec_factor=4.0)
    proposal = index.propose([1, 2], 4)
    assert proposal.tokens == [3, 5] and proposal.score == pytest.approx(0.75 + 0.75)
    strict = index_of([1, 2, 3, 5], [1, 2, 4, 6], spec_factor=4.0, min_token_prob=0.6)
    assert strict.propose([1, 2], 4) == EMPTY  # 1/2 < 0.6


def test_longer_match_beats_frequent_short_one():
    """(7, 8) is followed by 1 three times and by 2 once; the longer context (5, 6, 7, 8) occurred only
    before 2, and its unanimous continuation scores higher."""
    index = index_of([0, 7, 8, 1, 1], [3, 7, 8, 1, 1], [4, 7, 8, 1, 1], [5, 6, 7, 8, 2, 2, 2, 2], spec_factor=2.0)
    proposal = index.propose([5, 6, 7, 8], 4)
    assert proposal.tokens == [2, 2, 2, 2] and proposal.match_len == 4 and proposal.score == 4.0
    short = index.propose([9, 7, 8], 4)
    assert short.tokens[0] == 1 and short.match_len == 2


def test_no_match_short_context_and_sequence_boundaries():
    index = index_of([1, 2, 3], [4, 5, 6])
    assert index.propose([9, 9], 4) == EMPTY
    assert index.propose([2], 4) == EMPTY  # shorter than min_match
    assert index.propose([2, 3], 4) == EMPTY  # (2, 3) ends its sequence: never continued into (4, 5, 6)
    assert index.propose([5, 6], 0) == EMPTY


def test_request_index_proposes_from_prompt_and_own_output():
    local = RequestIndex([10, 11, 12, 13, 14, 20, 21])
    assert local.propose([10, 11, 12, 13, 14, 20, 21], 4) == EMPTY  # the tail has no earlier occurrence
    local.extend([10, 11, 12])
    context = [10, 11, 12, 13, 14, 20, 21, 10, 11, 12]
    assert local.propose(context, 8).tokens == [13, 14, 20]  # match length 3 allows 3 tokens
    shared = index_of([11, 12, 99, 98, 97])
    assert best_proposal(context, 8, local, shared).tokens == [13, 14, 20]  # 3.0 beats the shared 2.0
    assert best_proposal(context, 8, None, shared).tokens == [99, 98]


def test_request_index_matches_single_tokens_but_the_shared_index_does_not():
    """An answer that copies a name from its prompt: after one shared token the request's own part
    proposes (a match of length 1 drafts one token); the shared index needs min_match (2) tokens."""
    prompt = [5, 40, 41, 42, 6, 7]
    local = RequestIndex(prompt)
    context = prompt + [9, 40]
    assert local.propose(context, 8) == Proposal(tokens=[41], score=1.0, match_len=1, probs=(1.0,),
                                                 stretch=(42,), stretch_probs=(1.0,))
    shared = index_of(prompt)
    assert shared.propose(context, 8) == EMPTY
    assert RequestIndex(prompt, SuffixConfig(request_min_match=2)).propose(context, 8) == EMPTY


def test_the_walk_past_the_cap_is_the_stretch_outside_the_score():
    """A match of length m proposes m tokens (spec_factor 1) and offers the next ones up to
    m * stretch_factor as the stretch; choosing between match lengths still reads the score alone."""
    index = index_of([1, 2, 3, 4, 5, 6, 7, 8, 9])
    proposal = index.propose([0, 2, 3], 8)  # matches (2, 3): m = 2
    assert proposal.tokens == [4, 5] and proposal.score == 2.0 and proposal.match_len == 2
    assert proposal.stretch == (6, 7) and proposal.stretch_probs == (1.0, 1.0)
    assert proposal.stretched(1) == Proposal(tokens=[4, 5, 6], score=3.0, match_len=2, probs=(1.0, 1.0, 1.0))
    assert proposal.stretched(0) == Proposal(tokens=[4, 5], score=2.0, match_len=2, probs=(1.0, 1.0))
    assert index.propose([0, 2, 3], 3).stretch == (6,)  # max_k bounds the stretch too
    off = index_of([1, 2, 3, 4, 5, 6, 7, 8, 9], stretch_factor=1.0)
    assert off.propose([0, 2, 3], 8).stretch == ()
    with pytest.raises(ValueError, match="stretch_factor"):
        SuffixConfig(stretch_factor=-1.0)


def test_eviction_keeps_the_newest_requests_within_both_bounds():
    index = index_of(max_requests=3, max_tokens=1000)
    for i in range(10):
        index.add([100 + i, 1, 2, 3, 50 + i])
    assert index.requests == 3 and index.tokens == 15
    assert index.propose([1, 2, 3], 1).tokens == [59]  # the newest
    # Only the 3 newest still count: 57, 58, 59 once each.
    assert index.propose([1, 2, 3], 1).score == pytest.approx(1 / 3)
    assert index.propose([104, 1], 4) == EMPTY and index.propose([109, 1], 2).tokens == [2, 3]
    by_tokens = index_of(max_requests=100, max_tokens=12)
    for i in range(10):
        by_tokens.add([1, 2, 3, 50 + i])
    assert by_tokens.requests == 3 and by_tokens.tokens == 12
    long = index_of(max_tokens=4)
    long.add([1, 2, 3, 4, 5, 6])
    assert long.tokens == 4 and long.propose([3, 4], 2).tokens == [5, 6]


def test_memory_stays_bounded_under_churn():
    """Thousands of requests through a small index: the buffer is compacted, the table drops evicted
    n-grams, and proposals still come only from the newest requests."""
    index = index_of(max_requests=50, max_tokens=100_000)
    for i in range(3000):
        index.add([(i * 7 + j) % 997 for j in range(40)])
    assert index.requests == 50 and index.tokens == 2000
    assert len(index._store._table) <= 50 * 39 and len(index._store._buf) <= 8 * 2050
    first = index.nbytes()
    for i in range(3000, 6000):
        index.add([(i * 7 + j) % 997 for j in range(40)])
    assert index.nbytes() <= 1.5 * first
    newest = [(5999 * 7 + j) % 997 for j in range(40)]
    assert index.propose(newest[:10], 4).tokens == newest[10:14]


def _record(target: ModelId, prompt, output) -> AcceptanceRecord:
    return AcceptanceRecord(request_id="r", ts=time.time(), slice="s", target_id=target, draft_id=None,
                            mode="autoregressive", sampling=Sampling(), prompt="p", prompt_token_ids=prompt,
                            output="o", output_token_ids=output, finish_reason="stop")


def test_targets_are_never_mixed():
    mine, other = ModelId("tgt", "1", "aa" * 32), ModelId("tgt", "2", "bb" * 32)
    index = SuffixIndex(target_key(mine))
    assert index.add_record(_record(mine, [1, 2], [3, 4, 5]))
    assert not index.add_record(_record(other, [1, 2], [7, 7, 7]))
    assert index.requests == 1 and index.propose([1, 2], 2).tokens == [3, 4]
    index.check_target(mine)
    with pytest.raises(ValueError, match="suffix index"):
        index.check_target(other)
    assert target_key(ModelId("x", "3")) == "x@3"  # no weights hash: name and version


def test_from_logs_reads_matching_records_and_skips_bad_lines(tmp_path):
    mine, other = ModelId("tgt", sha256="aa" * 32), ModelId("tgt", sha256="bb" * 32)
    lines = [_record(mine, [1, 2], [3, 4]).to_json(), "{not json", _record(other, [1, 2], [9, 9]).to_json(),
             json.dumps({"schema_version": 1})]
    (tmp_path / "acceptance.jsonl").write_text("\n".join(lines) + "\n")
    index = SuffixIndex.from_logs(tmp_path, target_key(mine))
    assert index.requests == 1 and index.propose([1, 2], 2).tokens == [3, 4]


def test_propose_is_pure():
    index = index_of([1, 2, 3, 4, 5], [1, 2, 3, 6, 7])
    before = (index.requests, index.tokens, index.nbytes())
    assert index.propose([1, 2, 3], 3) == index.propose([1, 2, 3], 3)
    assert (index.requests, index.tokens, index.nbytes()) == before


@pytest.mark.parametrize("bad", [{"min_match": 4}, {"max_tokens": 0}, {"max_depth": 1, "min_match": 2},
                                 {"request_min_match": 0}, {"max_depth": 2, "request_min_match": 3},
                                 {"min_token_prob": 1.5}, {"spec_factor": -1.0}])
def test_config_rejects_bad_values_by_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad)) if "max_depth" not in bad else "max_depth"):
        SuffixConfig(**bad)


def test_sequences_returns_the_kept_requests_oldest_first():
    index = index_of([1, 2, 3], [4, 5], [6, 7, 8, 9], max_requests=2)
    assert index.sequences() == [[4, 5], [6, 7, 8, 9]]


def test_read_only_view_proposes_but_learns_nothing():
    mine, other = ModelId("tgt", sha256="aa" * 32), ModelId("tgt", sha256="bb" * 32)
    index = SuffixIndex(target_key(mine))
    index.add([1, 2, 3, 4, 5])
    view = ReadOnlyIndex(index)
    assert view.propose([9, 2, 3], 4) == index.propose([9, 2, 3], 4)
    assert view.propose([9, 2, 3], 4).tokens == [4, 5]
    assert view.add_record(_record(mine, [7, 8, 9], [10, 11])) is False
    assert (index.requests, index.tokens) == (1, 5)  # the record did not reach the index
    view.check_target(mine)
    with pytest.raises(ValueError, match="suffix index"):
        view.check_target(other)
