"""`draftwheel ingest`: request/response logs a user already keeps -> acceptance records mining reads.

Input: JSONL (plain or gzip), one exchange per line, `{"request": {...}, "response": ...}`: the OpenAI
request body as sent to `/v1/completions` or `/v1/chat/completions`, and the response body (vLLM's
`metrics.speculative_decoding` included when the server sent it) or the list of a streamed response's
chunks (objects, or the SSE lines `data: {...}`). Each line becomes one record, built exactly as
`draftwheel proxy` builds it (`draftwheel.serving.server.exchange.record_from_exchange`: `source` set,
no steps, token ids only where the log has them), and is written through the engine's `JsonlSink` to
the log dir. A line that gives no record (not JSON, no request or response, an error response, several
choices, a chat request without a tokenizer to render its prompt) is quarantined the way mining
quarantines bad log lines (`draftwheel.mining.log_reader.Quarantine`: position, kind, reason, scrubbed
text) and counted by kind; the run goes on. No deduplication: ingesting a file twice logs it twice
(mining's exact dedupe keeps one copy of each prompt).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from draftwheel.mining.log_reader import Quarantine, scan_lines
from draftwheel.mining.pii import Scrubber
from draftwheel.serving.engine.sink import JsonlSink
from draftwheel.serving.server.exchange import ExchangeError, record_from_exchange

QUARANTINE_MAX_CHARS = 2000


def _exchange(line: bytes) -> tuple[Any, Any]:
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExchangeError(f"not JSON: {getattr(exc, 'msg', exc)}", "not_json") from exc
    except RecursionError as exc:
        raise ExchangeError("not JSON: nested too deeply", "not_json") from exc
    if not isinstance(data, dict):
        raise ExchangeError(f"expected a JSON object, got {type(data).__name__}", "not_an_object")
    for name in ("request", "response"):
        if data.get(name) is None:
            raise ExchangeError(f"missing field {name!r}", "missing_field")
    return data["request"], data["response"]


def ingest(path: str | Path, log_dir: str | Path, quarantine_path: str | Path, tokenizer: Any = None,
           source: str = "") -> dict[str, Any]:
    """Write one acceptance record per good line of `path` to `log_dir`; quarantine the rest in
    `quarantine_path`. Returns the counts (`lines`, `records`, `quarantined`, `blank`, `quarantine_by_kind`).
    `source` defaults to `ingest:<file name>`; `tokenizer` (the target's) renders chat prompts."""
    path, quarantine_path = Path(path), Path(quarantine_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    source = source or f"ingest:{path.name}"
    quarantine_path.parent.mkdir(parents=True, exist_ok=True)
    counts: Counter[str] = Counter()
    with JsonlSink(log_dir) as sink, Quarantine(quarantine_path, Scrubber(), QUARANTINE_MAX_CHARS) as quarantine:
        sink.check_writable()
        for number, offset, line in scan_lines(path, quarantine):
            counts["lines"] += 1
            if line is None:  # over the line-length limit: quarantined unread by scan_lines
                continue
            if line.isspace():
                counts["blank"] += 1
                continue
            try:
                request, response = _exchange(line)
                record = record_from_exchange(request, response, source=source, tokenizer=tokenizer)
            except ExchangeError as exc:
                quarantine.add(path, number, offset, exc.kind, str(exc), line)
                continue
            if sink.write(record):
                counts["records"] += 1
            else:
                counts["write_failed"] += 1
        kinds = dict(quarantine.kinds)
    return {"file": str(path), "log_dir": str(log_dir), "source": source, "lines": counts["lines"],
            "records": counts["records"], "blank": counts["blank"], "write_failed": counts["write_failed"],
            "quarantined": sum(kinds.values()), "quarantine_by_kind": kinds, "quarantine": str(quarantine_path)}
