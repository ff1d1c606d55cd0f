"""JsonlSink: append-only JSONL with rotation, batched fsync, crash semantics and failures that never raise."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from draftwheel.serving.server.metrics import Metrics
from draftwheel.serving.engine.records import RecordError, parse_record
from draftwheel.serving.engine.sink import MAX_LINE_BYTES, JsonlSink, bounded_lines, iter_lines, log_files, valid_records
from tests.serving.test_metrics import make_record

REPO = Path(__file__).resolve().parents[2]


def _read(log_dir: Path) -> tuple[list, list[str]]:
    """(parsed records, reasons of bad lines), as a reader that skips bad lines would see them."""
    good, bad = [], []
    for _, _, line in iter_lines(log_dir):
        try:
            good.append(parse_record(line))
        except RecordError as exc:
            bad.append(str(exc))
    return good, bad


def _run_child(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_round_trip_one_record_per_line(tmp_path):
    records = [make_record([(4, i % 5)], request_id=f"r{i}") for i in range(5)]
    with JsonlSink(tmp_path) as sink:
        assert all(sink.write(r) for r in records)
    lines = (tmp_path / "acceptance.jsonl").read_text().splitlines()
    assert lines == [r.to_json() for r in records]
    good, bad = _read(tmp_path)
    assert [r.request_id for r in good] == [f"r{i}" for i in range(5)] and not bad
    assert good[3].steps == records[3].steps


def test_rotation_keeps_every_record_in_order_and_files_small(tmp_path):
    # + 8 below: `ts` varies a byte or two in length between records
    line_bytes = len(make_record([(4, 2)], request_id="r00").to_json()) + 1
    with JsonlSink(tmp_path, max_bytes=3 * line_bytes + 8) as sink:
        for i in range(10):
            sink.write(make_record([(4, 2)], request_id=f"r{i:02d}"))
    files = log_files(tmp_path)
    assert len(files) == 4 and files[-1].name == "acceptance.jsonl"
    assert [f.name.split(".")[1] for f in files[:-1]] == ["000001", "000002", "000003"]
    assert all(f.stat().st_size <= 3 * line_bytes + 8 for f in files)
    good, bad = _read(tmp_path)
    assert [r.request_id for r in good] == [f"r{i:02d}" for i in range(10)] and not bad
    # A restarted writer continues the sequence instead of overwriting rotated files.
    with JsonlSink(tmp_path, max_bytes=3 * line_bytes + 8) as sink:
        for i in range(10, 13):
            sink.write(make_record([(4, 2)], request_id=f"r{i:02d}"))
    assert [f.name.split(".")[1] for f in log_files(tmp_path)[:-1]] == ["000001", "000002", "000003", "000004"]
    assert [r.request_id for r in _read(tmp_path)[0]] == [f"r{i:02d}" for i in range(13)]


def test_rotated_files_can_be_gzipped(tmp_path):
    line_bytes = len(make_record([(4, 2)], request_id="r0").to_json()) + 1
    with JsonlSink(tmp_path, max_bytes=2 * line_bytes + 8, compress=True) as sink:
        for i in range(7):
            sink.write(make_record([(4, 2)], request_id=f"r{i}"))
    names = [f.name for f in log_files(tmp_path)]
    assert len(names) == 4 and all(n.endswith(".jsonl.gz") for n in names[:-1])
    assert not list(tmp_path.glob("*.tmp"))
    assert [r.request_id for r in _read(tmp_path)[0]] == [f"r{i}" for i in range(7)]


def test_fsync_is_batched_but_every_line_reaches_the_file_at_once(tmp_path):
    sink = JsonlSink(tmp_path, flush_every=3)
    for i in range(7):
        sink.write(make_record([(2, 1)], request_id=f"r{i}"))
        # Visible to other readers immediately (in the kernel), even before the batch is fsynced.
        assert len((tmp_path / "acceptance.jsonl").read_text().splitlines()) == i + 1
    assert sink.fsyncs == 2
    sink.close()
    assert sink.fsyncs == 3  # the tail batch of 1 record on close
    sink.close()  # idempotent
    assert sink.fsyncs == 3


def test_killed_process_loses_nothing_already_written(tmp_path):
    code = (
        "import os, signal, sys\n"
        "from draftwheel.serving.engine.sink import JsonlSink\n"
        "from tests.serving.test_metrics import make_record\n"
        "sink = JsonlSink(sys.argv[1], flush_every=100)\n"
        "for i in range(5):\n"
        "    sink.write(make_record([(3, 1)], request_id=f'r{i}'))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = _run_child(code, tmp_path)
    assert result.returncode == -9, result.stderr
    good, bad = _read(tmp_path)
    assert [r.request_id for r in good] == [f"r{i}" for i in range(5)] and not bad


def test_normal_exit_without_close_syncs_and_closes_via_atexit(tmp_path):
    code = (
        "import atexit, sys\n"
        "from draftwheel.serving.engine.sink import JsonlSink\n"
        "from tests.serving.test_metrics import make_record\n"
        "holder = []\n"
        "atexit.register(lambda: print('fsyncs', holder[0].fsyncs, 'closed', holder[0]._closed))\n"
        "holder.append(JsonlSink(sys.argv[1], flush_every=100))\n"  # atexit runs LIFO: sink.close() first
        "holder[0].write(make_record([(3, 1)]))\n"
    )
    result = _run_child(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "fsyncs 1 closed True" in result.stdout


def test_truncated_last_line_is_skipped_and_not_glued_to_the_next(tmp_path):
    with JsonlSink(tmp_path) as sink:
        for i in range(3):
            sink.write(make_record([(4, 4)], request_id=f"r{i}"))
    partial = make_record([(4, 4)], request_id="lost").to_json()[:57]
    with open(tmp_path / "acceptance.jsonl", "a") as handle:  # a crash in the middle of a write
        handle.write(partial)
    good, bad = _read(tmp_path)
    assert [r.request_id for r in good] == ["r0", "r1", "r2"]
    assert len(bad) == 1 and bad[0].startswith("not JSON")
    with JsonlSink(tmp_path) as sink:  # the restarted server appends after the torn line
        sink.write(make_record([(4, 4)], request_id="r3"))
    good, bad = _read(tmp_path)
    assert [r.request_id for r in good] == ["r0", "r1", "r2", "r3"] and len(bad) == 1


def test_disk_full_is_counted_and_logged_never_raised(tmp_path, caplog):
    if not os.path.exists("/dev/full"):
        pytest.skip("/dev/full not available")
    (tmp_path / "acceptance.jsonl").symlink_to("/dev/full")  # every write fails with ENOSPC
    metrics = Metrics()
    sink = JsonlSink(tmp_path, flush_every=1, metrics=metrics)
    assert sink.write(make_record([(2, 2)])) is False
    assert sink.write(make_record([(2, 2)])) is False
    assert sink.write_errors == 2 and sink.records_written == 0
    assert metrics.value("draftwheel_log_write_errors_total") == 2
    assert "No space left on device" in caplog.text
    sink.close()
    assert sink.write(make_record([(2, 2)])) is False  # a closed sink also counts, never raises
    assert metrics.value("draftwheel_log_write_errors_total") == 3


def test_partial_write_at_file_size_limit_is_rolled_back(tmp_path):
    """RLIMIT_FSIZE makes the kernel accept only part of the line that crosses the limit, then fail
    (EFBIG); the sink must truncate that partial line so the file holds only whole records."""
    code = (
        "import json, resource, signal, sys\n"
        "from draftwheel.serving.engine.sink import JsonlSink\n"
        "from tests.serving.test_metrics import make_record\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1500, resource.RLIM_INFINITY))\n"
        "sink = JsonlSink(sys.argv[1], flush_every=1)\n"
        "ok = [sink.write(make_record([(4, 1)] * 3, request_id=f'r{i}')) for i in range(8)]\n"
        "sink.close()\n"
        "print(json.dumps({'ok': ok, 'errors': sink.write_errors}))\n"
    )
    result = _run_child(code, tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    written = sum(report["ok"])
    assert 0 < written < 8 and report["errors"] == 8 - written
    assert report["ok"] == [True] * written + [False] * (8 - written)
    good, bad = _read(tmp_path)
    assert [r.request_id for r in good] == [f"r{i}" for i in range(written)] and not bad
    assert (tmp_path / "acceptance.jsonl").read_bytes().endswith(b"\n")


def test_concurrent_writers_never_interleave_lines(tmp_path):
    line_bytes = len(make_record([(4, 2)], request_id="t0-000").to_json()) + 1
    sink = JsonlSink(tmp_path, max_bytes=20 * line_bytes + 8, flush_every=7)

    def writer(t: int) -> None:
        for i in range(50):
            assert sink.write(make_record([(4, 2)], request_id=f"t{t}-{i:03d}"))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sink.close()
    good, bad = _read(tmp_path)
    assert not bad and len(good) == 200 and len(log_files(tmp_path)) >= 10
    ids = [r.request_id for r in good]
    assert sorted(ids) == sorted(f"t{t}-{i:03d}" for t in range(4) for i in range(50))
    for t in range(4):  # each thread's records appear in its own write order
        mine = [i for i in ids if i.startswith(f"t{t}-")]
        assert mine == sorted(mine)


def test_invalid_settings_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="max_bytes"):
        JsonlSink(tmp_path, max_bytes=0)
    with pytest.raises(ValueError, match="flush_every"):
        JsonlSink(tmp_path, flush_every=0)


class _ReadSpy(io.BytesIO):
    """A binary handle that remembers the most bytes any one read handed out, and refuses to be iterated
    (iteration reads a whole line, however long)."""

    largest = 0

    def readline(self, size=-1):
        data = super().readline(size)
        self.largest = max(self.largest, len(data))
        return data

    def __iter__(self):
        raise AssertionError("lines must be read with a size limit")


def test_bounded_lines_never_hold_more_than_the_limit_of_one_line():
    """A 1 MiB line under a 1000-byte limit comes back flagged, cut to limit + 1 bytes, with its whole size;
    a line of exactly the limit, and a last line without a newline, come back whole."""
    exact, huge, last = b"a" * 1000 + b"\n", b"b" * (1 << 20) + b"\n", b"c" * 10
    spy = _ReadSpy(exact + huge + last)
    lines = list(bounded_lines(spy, max_bytes=1000))
    assert [(line.size, line.too_long) for line in lines] == [(1001, False), (len(huge), True), (10, False)]
    assert lines[0].data == exact and lines[1].data == huge[:1001] and lines[2].data == last
    assert spy.largest <= 1001


def test_readers_skip_a_line_over_max_line_bytes(tmp_path):
    """`valid_records` (the suffix index, the shadow's served index, the monitor) and `iter_lines` skip a
    9 MiB line unread and keep the records around it."""
    records = [make_record([(4, 2)], request_id=f"r{i}") for i in range(2)]
    with open(tmp_path / "acceptance.jsonl", "w") as handle:
        handle.write(records[0].to_json() + "\n" + '{"prompt": "' + "z" * (9 << 20) + '"}\n' + records[1].to_json() + "\n")
    assert [r.request_id for r in valid_records(log_files(tmp_path))] == ["r0", "r1"]
    assert [number for _, number, _ in iter_lines(tmp_path)] == [1, 3]
    assert MAX_LINE_BYTES == 8 * 1024 * 1024
