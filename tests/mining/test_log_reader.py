"""Scanning logs: the one-pass msgspec path of draftwheel.serving.engine.records.parse_record agrees with its standard
library path, bad lines and unreadable files are quarantined with reason and position, good lines are
never dropped, gzip/rotation/truncation are handled."""

from __future__ import annotations

import copy
import gzip
import json
import random
import pytest

from draftwheel.mining.pipeline import mine
from draftwheel.mining.log_reader import Quarantine, list_log_files, scan_lines
from draftwheel.serving.engine.sink import MAX_LINE_BYTES
from draftwheel.serving.engine.records import RecordError, check_record, parse_record, record_from_dict
from tests.mining.conftest import fast_config, make_record, write_lines


def _outcome(fn, line: bytes):
    try:
        record = fn(line)
    except RecordError as exc:
        return "bad", str(exc)
    return "ok", (record.request_id, record.ts, [(s.k, s.accepted) for s in record.steps])


def _slow_path(line: bytes):
    record = record_from_dict(json.loads(line))
    check_record(record)
    return record


def _mutations(rng: random.Random, record: dict) -> dict:
    """One random defect (or a harmless change) of the kinds a broken writer could produce."""
    record = copy.deepcopy(record)
    values = [None, True, 1, 1.0, 1.5, "x", [], {}, [1, "a"], -1, 2, float("nan")]
    choice = rng.randrange(5)
    if choice == 0:
        del record[rng.choice(sorted(record))]
    elif choice == 1:
        record[rng.choice(sorted(record))] = rng.choice(values)
    elif choice == 2 and record["steps"]:
        step = rng.choice(record["steps"])
        step[rng.choice(sorted(step))] = rng.choice(values)
    elif choice == 3:
        record["sampling"][rng.choice(["temperature", "seed", "unknown_key"])] = rng.choice(values)
    else:
        record[rng.choice(["target_id", "draft_id"])] = rng.choice([None, {"name": 3}, {"name": "m", "x": 1}, "m"])
    return record


def test_fast_path_agrees_with_the_standard_library_path_on_random_defects():
    rng = random.Random(0)
    base = make_record(seed=1)
    disagreements = []
    for _ in range(600):
        line = json.dumps(_mutations(rng, base)).encode() + b"\n"
        fast, slow = _outcome(parse_record, line), _outcome(_slow_path, line)
        if repr(fast) != repr(slow):  # repr: a NaN ts is equal to itself
            disagreements.append(line[:200])
    assert not disagreements


@pytest.mark.parametrize("changes", [
    {"schema_version": 1.0},          # 1.0 == 1 for the standard-library path
    {"ts": float("nan")},             # json accepts NaN; msgspec does not, the fallback does
    {"extra_field": {"nested": True}},  # unknown top-level fields are ignored
])
def test_lines_the_standard_library_accepts_are_never_rejected(changes):
    line = json.dumps(make_record(**changes)).encode()
    assert _outcome(parse_record, line)[0] == "ok"


def test_parse_errors_of_any_kind_become_quarantine_reasons():
    # An integer ts too large for a float.
    text = json.dumps(make_record()).replace('"ts": 1700000000.0', '"ts": 1' + "0" * 400)
    with pytest.raises(RecordError, match="'ts'"):
        parse_record(text.encode())
    with pytest.raises(RecordError, match="nested too deeply"):  # json's RecursionError on absurd nesting
        parse_record(b"[" * 100_000)


def _bad_log_lines() -> tuple[list, dict[str, int]]:
    good = [make_record(i, ts=1.7e9 + i) for i in range(40)]
    cut = json.dumps(make_record(99))[:150]
    step_bad = make_record(98)
    step_bad["steps"][0]["accepted"] = 9
    bad = [
        (cut + "\n", "not_json"),
        (json.dumps(make_record(97, ts="noon")) + "\n", "wrong_type"),
        (json.dumps(make_record(96, drafted_tokens=True)) + "\n", "wrong_type"),
        (json.dumps(make_record(95, schema_version=3)) + "\n", "unknown_schema_version"),
        (json.dumps({k: v for k, v in make_record(94).items() if k != "prompt"}) + "\n", "missing_field"),
        ("[1, 2, 3]\n", "not_an_object"),
        (json.dumps(step_bad) + "\n", "bad_step"),
        (b"\xff\xfe\xfd\n", "not_json"),
        ('{"note": "contact alice@example.com"\n', "not_json"),
    ]
    lines: list = []
    for i, record in enumerate(good):
        lines.append(record)
        if i < len(bad):
            lines.append(bad[i][0])
        if i % 10 == 0:
            lines.append("   \n")  # blank lines are counted, not quarantined
    lines.append(cut)  # the last line, cut by a crash: no newline
    kinds: dict[str, int] = {}
    for _, kind in bad + [(None, "truncated")]:
        kinds[kind] = kinds.get(kind, 0) + 1
    return lines, kinds


def test_every_bad_line_kind_is_quarantined_with_position_and_no_good_line_is_lost(tmp_path):
    lines, kinds = _bad_log_lines()
    log = write_lines(tmp_path / "logs" / "acceptance.jsonl", lines)
    manifest = mine(tmp_path / "logs", tmp_path / "out", fast_config())
    counts = manifest["counts"]
    assert counts["kept"] == 40 and counts["blank"] == 4
    assert counts["quarantined"] == sum(kinds.values()) == 10
    assert manifest["quarantine_by_kind"] == kinds
    entries = [json.loads(line) for line in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()]
    data = log.read_bytes()
    raw = data.split(b"\n")
    for entry in entries:
        assert entry["file"] == str(log)
        assert data[entry["offset"]:].startswith(raw[entry["line"] - 1])  # line number and offset agree
        assert entry["reason"]
    assert entries[-1]["kind"] == "truncated" and entries[-1]["line"] == len(lines)
    # Quarantined text is scrubbed too: nothing is written unscrubbed.
    assert any("<EMAIL>" in e["text"] for e in entries) and not any("alice@" in e["text"] for e in entries)


def test_rotated_gzip_logs_are_read_in_write_order_and_a_corrupt_gzip_is_quarantined(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for seq in (1, 2):
        body = "".join(json.dumps(make_record(seq * 100 + i, ts=1.7e9 + seq * 100 + i)) + "\n" for i in range(10))
        with gzip.open(logs / f"acceptance.{seq:06d}.20261130T0{seq}0000Z.jsonl.gz", "wt") as handle:
            handle.write(body)
    write_lines(logs / "acceptance.jsonl", [make_record(300 + i, ts=1.7e9 + 300 + i) for i in range(5)])
    broken = gzip.compress(("".join(json.dumps(make_record(400 + i)) + "\n" for i in range(50))).encode())
    (logs / "extra.jsonl.gz").write_bytes(broken[: len(broken) // 2])
    files = list_log_files(logs)
    assert [f.name for f in files][:3] == ["acceptance.000001.20261130T010000Z.jsonl.gz",
                                           "acceptance.000002.20261130T020000Z.jsonl.gz", "acceptance.jsonl"]
    manifest = mine(logs, tmp_path / "out", fast_config())
    assert manifest["counts"]["kept"] >= 25
    assert manifest["quarantine_by_kind"].get("truncated", 0) >= 1
    assert [i["lines"] for i in manifest["inputs"]][:3] == [10, 10, 5]


def test_time_window_and_slice_filters(tmp_path):
    records = [make_record(i, ts=1000.0 + i) for i in range(60)]
    write_lines(tmp_path / "logs" / "a.jsonl", records)
    # ISO 8601 bounds: until = 1970-01-01T00:16:40Z = 1000 s, before every record.
    manifest = mine(tmp_path / "logs", tmp_path / "out", fast_config(until="1970-01-01T00:16:40Z"))
    assert manifest["counts"]["filtered_time"] == 60 and manifest["counts"].get("kept", 0) == 0
    manifest = mine(tmp_path / "logs", tmp_path / "out2", fast_config(since="1010", until="1040", slices=["code", "chat"]))
    expected = [r for r in records if 1010 <= r["ts"] < 1040]
    assert manifest["counts"]["filtered_time"] == 60 - len(expected)
    assert manifest["counts"]["kept"] == sum(r["slice"] in ("code", "chat") for r in expected)
    assert manifest["counts"]["filtered_slice"] == len(expected) - manifest["counts"]["kept"] > 0
    assert set(manifest["slices"]) <= {"code", "chat"}


def test_parallel_scan_gives_the_same_result_as_one_process(tmp_path):
    logs = tmp_path / "logs"
    for part in range(4):
        lines: list = [make_record(part * 50 + i, ts=3000.0 + part * 50 + i) for i in range(50)]
        lines.insert(7, "not json at all\n")
        write_lines(logs / f"acceptance.{part + 1:06d}.20261130T000000Z.jsonl", lines)
    one = mine(logs, tmp_path / "one", fast_config(workers=1))
    two = mine(logs, tmp_path / "two", fast_config(workers=3))
    for key in ("counts", "slices", "quarantine_by_kind", "inputs", "holdout_cutoff_ts"):
        assert one[key] == two[key], key
    for name in ("distill", "holdout", "quarantine"):
        assert one["outputs"][name]["rows"] == two["outputs"][name]["rows"]
    assert (tmp_path / "one" / "quarantine.jsonl").read_bytes() == (tmp_path / "two" / "quarantine.jsonl").read_bytes()
    assert one["scan_workers"] == 1 and two["scan_workers"] == 3
    assert all(0 < peak < 1024 for peak in two["scan_worker_peak_rss_mib"])


def _with_bad_line(tmp_path, bad: bytes):
    """40 good records with one bad line in the middle (line 21) of one log file."""
    lines: list = [make_record(i, ts=1.7e9 + i) for i in range(20)] + [bad + b"\n"]
    lines += [make_record(i, ts=1.7e9 + i) for i in range(20, 40)]
    return write_lines(tmp_path / "logs" / "acceptance.jsonl", lines)


def _line(**changes) -> bytes:
    return json.dumps(make_record(99, **changes)).encode()


# Hostile probes: each of these beside good logs aborted `draftwheel mine` or was kept.
@pytest.mark.parametrize("bad, kind", [
    (_line().replace(b'"prompt": "', b'"prompt": "\xff', 1), "not_json"),  # invalid UTF-8 in a string
    (b'{"a":' * 2000 + b"1" + b"}" * 2000, "not_json"),                      # nesting past the recursion limit
    (_line(drafted_tokens=-5), "out_of_range"),
    (_line(prompt_token_ids=[-1, 1180591620717411303424]), "out_of_range"),
    (_line(accepted_tokens=-3), "out_of_range"),
    (_line(drafted_tokens=1, accepted_tokens=1000), "inconsistent"),
    (_line(verify_steps=-1), "out_of_range"),
    (_line(verify_steps=1), "inconsistent"),                                  # steps list says otherwise
    (_line(drafted_tokens=3), "inconsistent"),                                # totals disagree with the steps
], ids=["utf8", "nesting", "drafted-5", "token-ids", "accepted-3", "accepted>drafted", "verify-1",
        "verify-vs-steps", "drafted-vs-steps"])
def test_a_bad_line_beside_good_logs_is_quarantined_with_file_line_and_reason(tmp_path, bad, kind):
    log = _with_bad_line(tmp_path, bad)
    manifest = mine(tmp_path / "logs", tmp_path / "out", fast_config())
    assert manifest["counts"]["kept"] == 40 and manifest["counts"]["quarantined"] == 1
    assert manifest["quarantine_by_kind"] == {kind: 1}
    [entry] = [json.loads(line) for line in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert entry["file"] == str(log) and entry["line"] == 21 and entry["reason"]
    for figures in manifest["slices"].values():  # impossible counts never reach the manifest
        assert 0.0 <= figures["acceptance_rate"] <= 1.0 and figures["mean_accepted_length"] >= 1.0


def test_a_log_file_that_is_a_symlink_to_itself_is_quarantined_not_fatal(tmp_path):
    logs = tmp_path / "logs"
    write_lines(logs / "acceptance.jsonl", [make_record(i, ts=1.7e9 + i) for i in range(10)])
    loop = logs / "acceptance.000001.20261130T000000Z.jsonl"
    loop.symlink_to(loop.name)
    manifest = mine(logs, tmp_path / "out", fast_config())
    assert manifest["counts"]["kept"] == 10 and manifest["quarantine_by_kind"] == {"unreadable_file": 1}
    [entry] = [json.loads(line) for line in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert entry["file"] == str(loop) and "symbolic links" in entry["reason"]


def test_requests_the_suffix_tier_served_well_are_skipped(tmp_path):
    records = [make_record(i, ts=1000.0 + i) for i in range(40)]
    for record in records[::3]:  # every third request: the suffix index drafted all its steps
        for step in record["steps"]:
            step["source"] = "suffix"
    write_lines(tmp_path / "logs" / "a.jsonl", records)

    def suffix_length(record):
        steps = [s for s in record["steps"] if s.get("source") == "suffix"]
        return (sum(s["accepted"] for s in steps) + len(steps)) / len(steps) if steps else 0.0

    threshold = 3.0
    skipped = sum(suffix_length(r) > threshold for r in records)
    assert 0 < skipped < len(records[::3])  # the rule separates some suffix-served requests from others
    manifest = mine(tmp_path / "logs", tmp_path / "out", fast_config(skip_suffix_served_above=threshold))
    assert manifest["counts"]["filtered_suffix"] == skipped
    assert manifest["counts"]["kept"] == len(records) - skipped
    assert "filtered_suffix" not in mine(tmp_path / "logs", tmp_path / "out2", fast_config())["counts"]
    with pytest.raises(ValueError, match="skip_suffix_served_above"):
        fast_config(skip_suffix_served_above=0.5)


def test_a_line_over_the_limit_is_quarantined_as_too_long_with_its_position(tmp_path):
    """A 1 MiB line under a 64 KiB limit: yielded as None and quarantined as `too_long` with its line,
    offset and size; the lines around it come back whole, at their offsets."""
    limit = 64 * 1024
    good = [json.dumps(make_record(i, ts=1.7e9 + i)).encode() + b"\n" for i in range(3)]
    huge = b'{"prompt": "' + b"x" * (1 << 20) + b'"}\n'
    log = write_lines(tmp_path / "acceptance.jsonl", [good[0], huge, good[1], good[2]])
    with Quarantine(tmp_path / "q.jsonl", None, 50) as quarantine:
        lines = list(scan_lines(log, quarantine, max_line_bytes=limit))
    assert [line for _, _, line in lines] == [good[0], None, good[1], good[2]]
    assert [offset for _, offset, _ in lines] == [0, len(good[0]), len(good[0]) + len(huge),
                                                  len(good[0]) + len(huge) + len(good[1])]
    assert quarantine.kinds == {"too_long": 1}
    entry = json.loads((tmp_path / "q.jsonl").read_text())
    assert (entry["kind"], entry["line"], entry["offset"]) == ("too_long", 2, len(good[0]))
    assert str(len(huge)) in entry["reason"] and len(entry["text"]) == 50

def test_mine_quarantines_a_line_over_max_line_bytes_and_counts_it(tmp_path):
    """A valid record whose prompt makes its line 9 MiB, past `MAX_LINE_BYTES` (8 MiB): counted among the
    lines and as quarantined (`too_long`), never kept; the records around it are."""
    huge = make_record(1, ts=1.7e9 + 1, prompt="y" * (9 << 20))
    write_lines(tmp_path / "logs" / "acceptance.jsonl", [make_record(0, ts=1.7e9), huge, make_record(2, ts=1.7e9 + 2)])
    assert len(json.dumps(huge)) > MAX_LINE_BYTES
    manifest = mine(tmp_path / "logs", tmp_path / "out", fast_config())
    counts = manifest["counts"]
    assert (counts["lines"], counts["kept"], counts["quarantined"]) == (3, 2, 1)
    assert manifest["quarantine_by_kind"] == {"too_long": 1}
