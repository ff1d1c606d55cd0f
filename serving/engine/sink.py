"""Append-only JSONL sink for acceptance records, with size-based rotation and batched fsync.

One `AcceptanceRecord.to_json()` per line in `<log_dir>/<prefix>.jsonl` (the active file). When the
active file would grow past `max_bytes` it is closed, fsynced and renamed to
`<prefix>.<seq:06d>.<UTC timestamp>.jsonl` (gzipped in the background when `compress=True`), so file
names sort in write order and the active file is always the newest. `log_files()` lists them in
that order; `iter_lines()` reads them (gzip included), and `bounded_lines()` is how every reader of the
logs takes a line in: never more than `MAX_LINE_BYTES` of one line in memory.

Durability: every line reaches the kernel with one `os.write` as soon as it is written, so a process
crash loses at most the line being written; `fsync` runs every `flush_every` lines, on rotation and
on `close()` (also registered with `atexit`), so an OS crash or power loss loses at most the lines
since the last fsync. A write failure (disk full, permission, ...) never raises: it is counted in
`write_errors` (and in `Metrics`, when given), logged, and the partial line is truncated away or
terminated so it can never corrupt the next record. `health()` reports the counts and the last error
(`failing` while the latest write or fsync failed); `check_writable()` opens the active file up front, so
a server can refuse to start on a log dir it could never write instead of losing every record.

Not here: record validation (`draftwheel.serving.engine.records`), multi-process writers (one sink per log dir).
"""

from __future__ import annotations

import atexit
import gzip
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from draftwheel.serving.engine.records import AcceptanceRecord


class WriteErrorCounter(Protocol):
    """What the sink counts a failed write on: the server's Prometheus metrics have one
    (`log_write_errors`); the engine does not import them."""

    log_write_errors: Any

log = logging.getLogger(__name__)

MiB = 1024 * 1024
# The longest log line a reader takes in, newline excluded. A record the engine writes stays far below it (a
# prompt is capped at `max_prompt_chars`, an output at `max_new_tokens`); a longer line is damage or a hostile
# writer, and reading it whole would let one line take the reader's memory. Readers skip it unread (mining
# quarantines it as `too_long`).
MAX_LINE_BYTES = 8 * MiB
_SKIP_CHUNK = MiB  # the rest of a too-long line is read and dropped this many bytes at a time
_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT  # RDWR: to read the last byte back


def _rotated_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}\.(\d{{6}})\.[0-9TZ]+\.jsonl(\.gz)?$")


def log_files(log_dir: str | Path, prefix: str = "acceptance") -> list[Path]:
    """Rotated files (oldest first), then the active file if present: the order lines were written."""
    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        return []
    pattern = _rotated_pattern(prefix)
    rotated = sorted((int(m.group(1)), p) for p in log_dir.iterdir() if (m := pattern.match(p.name)))
    # A file caught mid-compression exists twice (.jsonl and .jsonl.gz); read the finished plain one.
    seen: dict[int, Path] = {}
    for seq, path in rotated:
        if seq not in seen or path.suffix == ".jsonl":
            seen[seq] = path
    files = [seen[seq] for seq in sorted(seen)]
    active = log_dir / f"{prefix}.jsonl"
    return files + ([active] if active.exists() else [])


class Line(NamedTuple):
    """One line of a log file as `bounded_lines` read it."""

    data: bytes
    """The line, newline included; of a too-long line only its first `max_bytes + 1` bytes."""
    size: int
    """Its whole length in bytes, so byte offsets stay right past a skipped line."""
    too_long: bool
    """Longer than `max_bytes` (newline excluded): its rest was read in chunks and dropped."""


def bounded_lines(handle: IO[bytes], max_bytes: int = MAX_LINE_BYTES) -> Iterator[Line]:
    """Every line of a binary handle, holding at most `max_bytes + 1` bytes of any one line in memory."""
    while data := handle.readline(max_bytes + 1):
        size, tail = len(data), data
        too_long = size > max_bytes and not data.endswith(b"\n")
        while too_long and not tail.endswith(b"\n") and (tail := handle.readline(min(_SKIP_CHUNK, max_bytes + 1))):
            size += len(tail)
        yield Line(data, size, too_long)


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield `(line_number, line)` for every non-empty line of one log file (plain or gzip) within
    `MAX_LINE_BYTES`; a longer line is skipped unread, as any other line no record parses from."""
    with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as handle:
        for number, line in enumerate(bounded_lines(handle), start=1):
            text = "" if line.too_long else line.data.decode("utf-8", errors="replace")
            if text.strip():
                yield number, text.rstrip("\n")


def valid_records(files: list[Path]) -> Iterator[AcceptanceRecord]:
    """The acceptance records of `files` that parse (draftwheel.serving.engine.records.parse_record), in order. Bad lines
    are skipped here: quarantining and counting them is mining's job; readers that only look do not."""
    from draftwheel.serving.engine.records import RecordError, parse_record

    for path in files:
        for _, line in read_lines(path):
            try:
                yield parse_record(line)
            except RecordError:
                continue


def iter_lines(log_dir: str | Path, prefix: str = "acceptance") -> Iterator[tuple[Path, int, str]]:
    """Yield `(file, line_number, line)` for every non-empty line of every log file, in write order."""
    for path in log_files(log_dir, prefix):
        for number, line in read_lines(path):
            yield path, number, line


class JsonlSink:
    """Thread-safe append-only writer of acceptance records; see the module docstring for guarantees."""

    def __init__(
        self, log_dir: str | Path, max_bytes: int = 64 * MiB, flush_every: int = 32,
        prefix: str = "acceptance", compress: bool = False, metrics: WriteErrorCounter | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        if flush_every <= 0:
            raise ValueError(f"flush_every must be > 0, got {flush_every}")
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.flush_every = flush_every
        self.prefix = prefix
        self.compress = compress
        self.metrics = metrics
        self.path = self.log_dir / f"{prefix}.jsonl"
        self.write_errors = 0
        self.last_error: str | None = None
        self.failing = False  # the latest write or fsync failed
        self.records_written = 0
        self.fsyncs = 0
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._unsynced = 0
        self._needs_newline = False
        self._rotation_failing = False
        self._closed = False
        self._compressors: list[threading.Thread] = []
        atexit.register(self.close)

    # -- public API -------------------------------------------------------------------------------

    def write(self, record: AcceptanceRecord | str) -> bool:
        """Append one record (or an already-serialised JSON line); return False if it was not written."""
        line = record if isinstance(record, str) else record.to_json()
        data = (line.rstrip("\n") + "\n").encode("utf-8")
        with self._lock:
            if self._closed:
                self._count_error(RuntimeError("sink is closed"))
                return False
            try:
                self._append(data)
            except OSError as exc:
                self._count_error(exc)
                return False
            self.records_written += 1
            self.failing = False
            self._unsynced += 1
            if self._unsynced >= self.flush_every:
                self._sync_quietly()
            return True

    def check_writable(self) -> None:
        """Open (creating if missing) the active file now; raise `OSError` if the log cannot be written."""
        with self._lock:
            if self._fd is None:
                self._open()

    def health(self) -> dict[str, object]:
        """Counts and the last error, for /healthz."""
        return {"dir": str(self.log_dir), "records_written": self.records_written,
                "write_errors": self.write_errors, "failing": self.failing, "last_error": self.last_error}

    def flush(self) -> None:
        """fsync the lines written since the last fsync (never raises)."""
        with self._lock:
            self._sync_quietly()

    def close(self) -> None:
        """fsync, close the active file and wait for background compression. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._sync_quietly()
            self._close_fd()
        for thread in self._compressors:
            thread.join()
        atexit.unregister(self.close)

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals (called with the lock held) ------------------------------------------------------

    def _append(self, data: bytes) -> None:
        if self._fd is not None and self._size > 0 and self._size + len(data) > self.max_bytes:
            self._rotate()
        if self._fd is None:
            self._open()
        if self._needs_newline:
            # An earlier failed write left a partial line we could not truncate: end it, so it
            # becomes one bad line that readers skip instead of corrupting this record.
            self._write_all(b"\n")
            self._needs_newline = False
        start = self._size
        try:
            self._write_all(data)
        except OSError:
            self._undo_partial(start)
            raise

    def _open(self) -> None:
        self._fd = os.open(self.path, _OPEN_FLAGS, 0o644)
        self._size = os.fstat(self._fd).st_size
        # After a crash the active file may end mid-line; never glue the next record onto it.
        self._needs_newline = self._size > 0 and os.pread(self._fd, 1, self._size - 1) != b"\n"

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            self._size += written
            view = view[written:]

    def _undo_partial(self, start: int) -> None:
        if self._fd is None or self._size == start:
            return
        try:
            os.ftruncate(self._fd, start)
            self._size = start
        except OSError:
            self._needs_newline = True

    def _sync_quietly(self) -> None:
        if self._fd is None or self._unsynced == 0:
            return
        try:
            os.fsync(self._fd)
            self.fsyncs += 1
            self._unsynced = 0
        except OSError as exc:
            self._count_error(exc)

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError as exc:
                self._count_error(exc)

    def _rotate(self) -> None:
        self._sync_quietly()
        self._close_fd()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.log_dir / f"{self.prefix}.{self._next_seq():06d}.{stamp}.jsonl"
        try:
            os.replace(self.path, target)
        except OSError as exc:
            # Keep appending to the oversized active file rather than losing records; no record is
            # lost, so this is logged (once until a rotation succeeds) but not counted as a write error.
            if not self._rotation_failing:
                log.error("acceptance log %s: rotation failed, appending to it past max_bytes: %s", self.path, exc)
            self._rotation_failing = True
            return
        self._rotation_failing = False
        if self.compress:
            thread = threading.Thread(target=_gzip_file, args=(target,), daemon=True, name="sink-gzip")
            thread.start()
            self._compressors = [t for t in self._compressors if t.is_alive()] + [thread]

    def _next_seq(self) -> int:
        pattern = _rotated_pattern(self.prefix)
        seqs = [int(m.group(1)) for p in self.log_dir.iterdir() if (m := pattern.match(p.name))]
        return max(seqs, default=0) + 1

    def _count_error(self, exc: BaseException) -> None:
        self.write_errors += 1
        self.last_error, self.failing = str(exc), True
        if self.metrics is not None:
            self.metrics.log_write_errors.inc()
        log.error("acceptance log %s: write failed (%d so far): %s", self.path, self.write_errors, exc)


def _gzip_file(path: Path) -> None:
    """Compress `path` to `path.gz` via a temp name, then remove the original (readers see one of them)."""
    tmp = path.with_name(path.name + ".gz.tmp")
    try:
        with open(path, "rb") as src, gzip.open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(tmp, path.with_name(path.name + ".gz"))
        path.unlink()
    except OSError as exc:
        log.error("acceptance log %s: compression failed, keeping it uncompressed: %s", path, exc)
        tmp.unlink(missing_ok=True)
