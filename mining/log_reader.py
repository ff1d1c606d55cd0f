"""Reading serving logs: list rotated files, decode and validate every line, quarantine the bad ones.

Lines are validated by `draftwheel.serving.engine.records.read_record`, the one definition of log schema v1 (this
module keeps no copy of it). `scan_lines` streams lines from plain and gzip files with their line
number and byte offset, so memory depends neither on file size nor on line length: a line longer than
`draftwheel.serving.engine.sink.MAX_LINE_BYTES` (8 MiB) is read in bounded chunks, dropped and quarantined as `too_long`.
`fetch_lines` re-reads selected lines later. A file that cannot be opened (a symlink loop, no permission)
is quarantined as a whole, never fatal. `Quarantine` writes bad lines (scrubbed, cut) with kind, reason and
position. Deciding what to do with good records is the caller's.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from draftwheel.mining.pii import Scrubber
from draftwheel.serving.engine.sink import MAX_LINE_BYTES, Line, bounded_lines, log_files


def list_log_files(logs: str | Path) -> list[Path]:
    """A file, or a directory's logs in write order (draftwheel.serving.engine.sink naming), then other *.jsonl[.gz] by name."""
    logs = Path(logs)
    if logs.is_file():
        return [logs]
    if not logs.is_dir():
        raise FileNotFoundError(f"logs: {logs} is neither a file nor a directory")
    ordered = log_files(logs)
    # Not `is_file()`: it is False for a symlink loop, which must be quarantined rather than skipped unseen.
    others = sorted(p for p in logs.iterdir() if not p.is_dir() and p.name.endswith((".jsonl", ".jsonl.gz"))
                    and p not in ordered and p.name != "quarantine.jsonl")
    # A plain file next to its .gz twin is a rotation caught mid-compression: read the plain one only.
    names = {p.name for p in ordered + others}
    others = [p for p in others if not (p.name.endswith(".gz") and p.name[:-3] in names)]
    return ordered + others


def _open(path: Path) -> IO[bytes]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb", buffering=1 << 20)


def file_size(path: Path) -> int:
    """Bytes in `path`, 0 if it cannot be stat'ed (scan_lines quarantines it)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def scan_lines(path: Path, quarantine: Quarantine,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, int, bytes | None]]:
    """Yield (line_number, byte_offset, line) for one file. A line longer than `max_line_bytes` is
    quarantined here as `too_long` and yielded as None (callers count it, never parse it); an unreadable
    file (line 0) or a corrupt gzip stream is quarantined, not raised."""
    number, offset = 0, 0
    try:
        handle = _open(path)
    except OSError as exc:
        quarantine.add(path, 0, 0, "unreadable_file", f"unreadable file: {exc.strerror or exc}", b"")
        return
    try:
        with handle:
            for number, line in enumerate(bounded_lines(handle, max_line_bytes), start=1):
                if line.too_long:
                    quarantine.add(path, number, offset, "too_long",
                                   f"line of {line.size} bytes, over the {max_line_bytes}-byte limit", line.data)
                yield number, offset, None if line.too_long else line.data
                offset += line.size
    except (EOFError, OSError, zlib.error) as exc:
        quarantine.add(path, number + 1, offset, "truncated", f"truncated or corrupt file: {exc}", b"")


_EMPTY = Line(b"", 0, False)  # what a re-read past the end of a file finds


def fetch_lines(path: Path, positions: Iterable[tuple[int, int]]) -> Iterator[tuple[int, bytes]]:
    """Re-read the lines at (line_number, offset) positions of one file, in file order."""
    wanted = sorted(set(positions))
    if not wanted:
        return
    if not path.name.endswith(".gz"):
        with open(path, "rb") as handle:
            for number, offset in wanted:
                handle.seek(offset)
                yield number, next(bounded_lines(handle), _EMPTY).data
        return
    # gzip cannot seek cheaply: stream once and pick the wanted line numbers.
    numbers = {number for number, _ in wanted}
    last = wanted[-1][0]
    with gzip.open(path, "rb") as handle:
        for number, line in enumerate(bounded_lines(handle), start=1):
            if number in numbers:
                yield number, line.data
            if number >= last:
                break


class Quarantine:
    """quarantine.jsonl: one JSON object per bad line with file, line, offset, kind, reason and the
    (scrubbed) text. Kinds: `draftwheel.serving.engine.records.RecordError.kind`, `truncated`, `too_long`, `unreadable_file`."""

    def __init__(self, path: Path, scrubber: Scrubber | None, max_chars: int):
        self.path = path
        self.scrubber = scrubber
        self.max_chars = max_chars
        self.kinds: Counter[str] = Counter()
        self._handle = open(path, "w", encoding="utf-8")

    def add(self, file: Path, line: int, offset: int, kind: str, reason: str, raw: bytes) -> None:
        """One bad line (`line` 0: the whole file); `kind` groups reasons in the manifest."""
        # a UTF-8 character is at most 4 bytes: decode no more of a long line than the text can keep
        text = raw[: 4 * self.max_chars + 1].decode("utf-8", errors="replace").rstrip("\n")[: self.max_chars]
        if self.scrubber is not None:
            text = self.scrubber.scrub(text)
        self.kinds[kind] += 1
        entry = {"file": str(file), "line": line, "offset": offset, "kind": kind, "reason": reason, "text": text}
        self._handle.write(json.dumps(entry, ensure_ascii=False) + "\n")

    @property
    def count(self) -> int:
        return sum(self.kinds.values())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> Quarantine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
