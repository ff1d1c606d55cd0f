"""Reading serving logs: list rotated files, decode and validate every line, quarantine the bad ones.

`decode_line` validates one line against log schema v1 exactly as `serving.records.parse_record`
does, but fast: a typed msgspec decoder accepts well-formed lines in one C pass, and anything it
rejects is handed to `parse_record`, which either accepts it (the decoder is only ever stricter: e.g.
`NaN`, a BOM, an int-valued float) or raises the reference `RecordError` reason. So the fast path can
never accept a line the schema rejects, and never drops a line the schema accepts.

`scan_lines` streams lines from plain and gzip files with their line number and byte offset, so memory
does not depend on file size; `fetch_lines` re-reads selected lines later. `Quarantine` writes bad
lines (scrubbed, cut) with reason and position. Deciding what to do with good records is the caller's.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Literal

import msgspec

from mining.pii import Scrubber
from serving.records import RecordError, parse_record
from serving.sink import log_files


class _ModelId(msgspec.Struct):
    name: str
    version: Any = ""
    sha256: Any = ""


class _Sampling(msgspec.Struct, forbid_unknown_fields=True):
    # The reference builds Sampling(**obj): any value, but no unknown key.
    temperature: Any = 0.0
    top_p: Any = 1.0
    top_k: Any = 0
    seed: Any = None


class _Step(msgspec.Struct):
    k: int
    accepted: int
    draft_token_ids: list[int]
    target_token_id: int


class FastRecord(msgspec.Struct):
    """Same attribute names as `serving.records.AcceptanceRecord`; downstream code reads either."""
    schema_version: Literal[1]
    request_id: str
    ts: float
    slice: str
    target_id: _ModelId
    mode: Literal["draft", "medusa", "autoregressive"]
    sampling: _Sampling
    prompt: str
    prompt_token_ids: list[int]
    output: str
    output_token_ids: list[int]
    finish_reason: str
    steps: list[_Step]
    drafted_tokens: int
    accepted_tokens: int
    verify_steps: int
    ttft_s: float
    latency_s: float
    draft_id: _ModelId | None = None


_DECODER = msgspec.json.Decoder(FastRecord)


def decode_line(line: bytes) -> Any:
    """One log line -> a record (FastRecord or AcceptanceRecord); raise `RecordError` if invalid."""
    try:
        record = _DECODER.decode(line)
    except msgspec.DecodeError:
        return _reference(line)
    for step in record.steps:
        if not 0 <= step.accepted <= step.k:
            return _reference(line)
    return record


def _reference(line: bytes) -> Any:
    try:
        return parse_record(line)
    except RecordError:
        raise
    except (ValueError, OverflowError, RecursionError, TypeError) as exc:
        # parse_record can still trip on e.g. ts=1e400 written as an integer; mining must not crash.
        raise RecordError(f"invalid value: {type(exc).__name__}: {exc}") from exc


def list_log_files(logs: str | Path) -> list[Path]:
    """A file, or a directory's logs in write order (serving.sink naming), then other *.jsonl[.gz] by name."""
    logs = Path(logs)
    if logs.is_file():
        return [logs]
    if not logs.is_dir():
        raise FileNotFoundError(f"logs: {logs} is neither a file nor a directory")
    ordered = log_files(logs)
    others = sorted(p for p in logs.iterdir() if p.is_file() and p.name.endswith((".jsonl", ".jsonl.gz"))
                    and p not in ordered and p.name != "quarantine.jsonl")
    # A plain file next to its .gz twin is a rotation caught mid-compression: read the plain one only.
    names = {p.name for p in ordered + others}
    others = [p for p in others if not (p.name.endswith(".gz") and p.name[:-3] in names)]
    return ordered + others


def _open(path: Path) -> IO[bytes]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb", buffering=1 << 20)


def scan_lines(path: Path, quarantine: Quarantine) -> Iterator[tuple[int, int, bytes]]:
    """Yield (line_number, byte_offset, line) for one file; a corrupt gzip stream is quarantined, not raised."""
    number, offset = 0, 0
    try:
        with _open(path) as handle:
            for number, line in enumerate(handle, start=1):
                yield number, offset, line
                offset += len(line)
    except (EOFError, OSError, zlib.error) as exc:
        quarantine.add(path, number + 1, offset, f"truncated or corrupt file: {exc}", b"")


def fetch_lines(path: Path, positions: Iterable[tuple[int, int]]) -> Iterator[tuple[int, bytes]]:
    """Re-read the lines at (line_number, offset) positions of one file, in file order."""
    wanted = sorted(set(positions))
    if not wanted:
        return
    if not path.name.endswith(".gz"):
        with open(path, "rb") as handle:
            for number, offset in wanted:
                handle.seek(offset)
                yield number, handle.readline()
        return
    # gzip cannot seek cheaply: stream once and pick the wanted line numbers.
    numbers = {number for number, _ in wanted}
    last = wanted[-1][0]
    with gzip.open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if number in numbers:
                yield number, line
            if number >= last:
                break


def reason_kind(reason: str) -> str:
    """Group reasons for the manifest: 'not_json', 'wrong_type', 'missing_field', ..."""
    prefixes = [("truncated", "truncated"), ("not JSON", "not_json"), ("unknown schema_version", "unknown_schema_version"),
                ("missing field", "missing_field"), ("field ", "wrong_type"), ("steps[", "bad_step"),
                ("expected a JSON object", "not_an_object"), ("invalid value", "invalid_value")]
    return next((kind for prefix, kind in prefixes if reason.startswith(prefix)), "other")


class Quarantine:
    """quarantine.jsonl: one JSON object per bad line with file, line, offset, reason and the (scrubbed) text."""

    def __init__(self, path: Path, scrubber: Scrubber | None, max_chars: int):
        self.path = path
        self.scrubber = scrubber
        self.max_chars = max_chars
        self.kinds: Counter[str] = Counter()
        self._handle = open(path, "w", encoding="utf-8")

    def add(self, file: Path, line: int, offset: int, reason: str, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\n")[: self.max_chars]
        if self.scrubber is not None:
            text = self.scrubber.scrub(text)
        self.kinds[reason_kind(reason)] += 1
        entry = {"file": str(file), "line": line, "offset": offset, "kind": reason_kind(reason), "reason": reason,
                 "text": text}
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
