"""The v1 acceptance record: JSON round trip and the reasons `parse_record` gives for bad lines."""

from __future__ import annotations

import dataclasses
import json

import pytest

from draftwheel.serving.engine.records import (AcceptanceRecord, Beside, ModelId, RecordError, Sampling, Step, add_counts,
                                               describe_shares, draft_counts, draft_steps, parse_record,
                                               source_counts, source_shares)


def make_record() -> AcceptanceRecord:
    return AcceptanceRecord(
        request_id="r1", ts=1.5, slice="chat", target_id=ModelId("t", "1", "ab"), draft_id=ModelId("d"),
        mode="draft", sampling=Sampling(), prompt="p", prompt_token_ids=[1, 2], output="o",
        output_token_ids=[3, 4, 5], finish_reason="stop",
        steps=[Step(k=4, accepted=1, draft_token_ids=[3, 9, 9, 9], target_token_id=4)],
        drafted_tokens=4, accepted_tokens=1, verify_steps=1,
    )


def test_round_trip_and_derived_figures():
    record = make_record()
    assert parse_record(record.to_json()) == record
    assert record.acceptance_rate == 0.25
    assert record.mean_accepted_length == 2.0  # 1 accepted + the target's token, in 1 verify step


@pytest.mark.parametrize("mutate, reason", [
    (lambda d: d.update(schema_version=2), "unknown schema_version"),
    (lambda d: d.pop("steps"), "missing field 'steps'"),
    (lambda d: d.update(drafted_tokens=True), "field 'drafted_tokens'"),
    (lambda d: d.update(mode="beam"), "field 'mode'"),
    (lambda d: d["steps"][0].update(accepted=5), "outside 0..k"),
    (lambda d: d.update(prompt_token_ids=[1, "2"]), r"prompt_token_ids\[1\]"),
])
def test_bad_fields_are_named(mutate, reason):
    data = json.loads(make_record().to_json())
    mutate(data)
    with pytest.raises(RecordError, match=reason):
        parse_record(json.dumps(data))


@pytest.mark.parametrize("line, reason", [
    ('{"request_id": "r1", "ts"', "not JSON"),  # a line truncated by a crash
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("[]", "expected a JSON object"),
])
def test_malformed_lines_raise_record_error(line, reason):
    with pytest.raises(RecordError, match=reason):
        parse_record(line)


def test_huge_integer_timestamp_is_a_record_error():
    data = json.loads(make_record().to_json())
    line = json.dumps(data).replace('"ts": 1.5', '"ts": ' + "9" * 400)
    with pytest.raises(RecordError, match="out of range"):
        parse_record(line)


# A hostile probe: impossible counts used to pass validation and reach the mining manifest.
@pytest.mark.parametrize("mutate, reason", [
    (lambda d: d.update(accepted_tokens=-3), "'accepted_tokens' = -3, must be >= 0"),
    (lambda d: d.update(drafted_tokens=-5), "'drafted_tokens' = -5, must be >= 0"),
    (lambda d: d.update(verify_steps=-1), "'verify_steps' = -1, must be >= 0"),
    (lambda d: d.update(drafted_tokens=1, accepted_tokens=1000), "accepted_tokens=1000 > drafted_tokens=1"),
    (lambda d: d.update(verify_steps=2), "'verify_steps' = 2 but the steps give 1"),
    (lambda d: d.update(drafted_tokens=5), "'drafted_tokens' = 5 but the steps give 4"),
    (lambda d: d["steps"][0].update(draft_token_ids=[3]), r"steps\[0\]: 1 draft_token_ids for k=4"),
    (lambda d: d.update(prompt_token_ids=[-1, 2**70]), r"'prompt_token_ids\[0\]' = -1"),
    (lambda d: d.update(output_token_ids=[3, 2**31]), r"'output_token_ids\[1\]' = 2147483648"),
    (lambda d: d["steps"][0].update(target_token_id=-2), r"'steps\[0\].target_token_id' = -2"),
])
def test_impossible_counts_and_token_ids_are_rejected_with_the_field(mutate, reason):
    data = json.loads(make_record().to_json())
    mutate(data)
    with pytest.raises(RecordError, match=reason):
        parse_record(json.dumps(data))


def test_token_ids_are_checked_against_the_vocabulary_when_it_is_known():
    line = make_record().to_json()  # largest id: 9
    assert parse_record(line, vocab_size=10).prompt_token_ids == [1, 2]
    with pytest.raises(RecordError, match=r"'steps\[0\].draft_token_ids\[1\]' = 9, token ids must be in \[0, 9\)"):
        parse_record(line, vocab_size=9)


def test_step_source_is_optional_written_only_when_set_and_read_back():
    record = make_record()
    assert '"source"' not in record.to_json()  # records without sources are byte-identical to older ones
    record.steps[0].source = "suffix"
    assert json.loads(record.to_json())["steps"][0]["source"] == "suffix"
    assert parse_record(record.to_json()) == record
    data = json.loads(record.to_json())
    data["steps"][0]["source"] = None  # an explicit null reads as "unknown"
    assert parse_record(json.dumps(data)).steps[0].source is None
    data["steps"][0]["source"] = 3
    with pytest.raises(RecordError, match=r"steps\[0\].source"):
        parse_record(json.dumps(data))


@pytest.mark.parametrize("line", [b"\xff\xfe not utf-8", b'{"prompt": "\xff"}', b"\x00", b"", b"{" * 5000])
def test_any_bytes_give_a_record_error_and_nothing_else(line):
    with pytest.raises(RecordError):
        parse_record(line)


def test_the_line_type_is_generated_from_the_dataclasses_and_reads_the_same_record():
    from dataclasses import fields

    from draftwheel.serving.engine.records import RecordLine, read_record

    assert RecordLine.__struct_fields__ == tuple(f.name for f in fields(AcceptanceRecord))
    line = read_record(make_record().to_json())
    assert isinstance(line, RecordLine) and line.steps[0].source is None
    assert parse_record(make_record().to_json()) == make_record()


def test_unknown_fields_are_ignored_except_in_sampling():
    data = json.loads(make_record().to_json())
    data["new_top_level"] = 1
    data["steps"][0]["new_step_field"] = 2
    data["target_id"]["new_id_field"] = 3
    assert parse_record(json.dumps(data)) == make_record()
    data["sampling"]["min_p"] = 0.1
    with pytest.raises(RecordError, match="field 'sampling': object contains unknown field `min_p`"):
        parse_record(json.dumps(data))


def hybrid_record() -> AcceptanceRecord:
    """A hybrid request: one step the suffix index drafted (5 of 6 accepted), two the draft drafted, one
    plain step (the pace chose the target alone: no source, nothing drafted)."""
    steps = [Step(k=6, accepted=5, draft_token_ids=[3] * 6, target_token_id=4, source="suffix"),
             Step(k=3, accepted=1, draft_token_ids=[3] * 3, target_token_id=4, source="eagle3"),
             Step(k=0, accepted=0, draft_token_ids=[], target_token_id=4),
             Step(k=2, accepted=0, draft_token_ids=[3] * 2, target_token_id=4, source="eagle3")]
    return AcceptanceRecord(
        request_id="h", ts=1.0, slice="code", target_id=ModelId("t"), draft_id=ModelId("d"), mode="hybrid",
        sampling=Sampling(), prompt="p", prompt_token_ids=[1], output="o", output_token_ids=[3] * 10,
        finish_reason="length", steps=steps, drafted_tokens=11, accepted_tokens=6, verify_steps=4)


def test_draft_counts_leave_out_the_suffix_index_and_plain_steps_of_a_hybrid_record():
    hybrid = hybrid_record()
    assert [s.source for s in draft_steps(hybrid)] == ["eagle3", "eagle3"]
    assert draft_counts(hybrid) == (5, 1, 2)  # the whole record: (11, 6, 4)
    assert draft_counts(parse_record(hybrid.to_json())) == (5, 1, 2)  # and the same for a record read back
    draft = make_record()
    assert draft_counts(draft) == (4, 1, 1) and draft_steps(draft) == draft.steps


def test_a_token_tree_step_keeps_the_proposal_beside_it_and_the_draft_counts_its_own_chain():
    record = hybrid_record()
    chain = Beside(k=3, accepted=1, draft_token_ids=[3, 5, 5], source="eagle3")
    record.steps[0] = Step(k=6, accepted=5, draft_token_ids=[3] * 6, target_token_id=4, source="suffix", beside=chain)
    read = parse_record(record.to_json())
    assert read == record and read.steps[0].beside == chain
    assert "beside" not in json.loads(record.to_json())["steps"][1]  # only where there is one
    # the index's branch won the first step: the draft's chain beside it is the draft's
    assert draft_counts(record) == (8, 2, 3) and draft_counts(read) == (8, 2, 3)
    data = json.loads(record.to_json())
    data["steps"][0]["beside"]["accepted"] = 6  # more than the step's own 5 and its k 3
    with pytest.raises(RecordError, match=r"steps\[0\].beside"):
        parse_record(json.dumps(data))
    data["steps"][0]["beside"].update(accepted=0, draft_token_ids=[3, 5, -1])
    with pytest.raises(RecordError, match="beside.draft_token_ids"):
        parse_record(json.dumps(data))


def test_steps_by_source_split_an_as_served_figure_into_its_parts():
    """Per source, the share of the steps and the tokens each emitted: the index's steps, the plain steps
    load imposed, the rows' own plain steps, and a mode that writes no source named by its mode."""
    hybrid = dataclasses.replace(make_record(), mode="hybrid", steps=[
        Step(k=4, accepted=3, draft_token_ids=[1] * 4, target_token_id=2, source="suffix"),
        Step(k=0, accepted=0, draft_token_ids=[], target_token_id=2, source="load"),
        Step(k=0, accepted=0, draft_token_ids=[], target_token_id=2)])
    drafted = dataclasses.replace(make_record(), steps=[
        Step(k=2, accepted=1, draft_token_ids=[1, 1], target_token_id=2),
        Step(k=3, accepted=0, draft_token_ids=[1] * 3, target_token_id=2, source="suffix")],
        drafted_tokens=5, verify_steps=2, output_token_ids=[1, 2, 3])
    counts = source_counts([hybrid, drafted])
    assert counts == {"suffix": [2, 5], "load": [1, 1], "plain": [1, 1], "draft": [1, 2]}
    assert add_counts([source_counts([hybrid]), source_counts([drafted])]) == counts  # rows add up exactly
    shares = source_shares(counts)
    assert list(shares) == ["suffix", "load", "plain", "draft"]  # most steps first
    assert shares["suffix"] == {"share": 0.4, "tokens_per_step": 2.5}
    assert describe_shares(shares) == "suffix 40% x 2.50, load 20% x 1.00, plain 20% x 1.00, draft 20% x 2.00"
    parsed = parse_record(drafted.to_json())  # a decoded log line reads the same
    assert source_counts([parsed]) == source_counts([drafted])
    assert source_shares({}) == {} and source_counts([]) == {}
