"""The v1 acceptance record: JSON round trip and the reasons `parse_record` gives for bad lines."""

from __future__ import annotations

import json

import pytest

from serving.records import AcceptanceRecord, ModelId, RecordError, Sampling, Step, parse_record


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
    (lambda d: d.update(prompt_token_ids=[1, "2"]), "list of ints"),
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
