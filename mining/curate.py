"""From selected candidates to the final sample lists: text-level dedupe, hold-out isolation, quotas.

Reads only the candidate lines (bounded by the caps), in file order, and keeps a small summary per
candidate (MinHash signature, normalised-text key, whether scrubbing would change it). Then it walks
the candidates in priority order -- hold-out first, then per slice hard, rollback, uniform -- and
keeps one unless it is an exact or near duplicate of something kept before (the hold-out included,
so no training prompt resembles a hold-out prompt) or it needs scrubbing and no tokenizer is there
to re-derive its ids. Writing the datasets is `mining.outputs`' job.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mining.config import MiningConfig
from mining.dedupe import NearDupIndex, exact_key
from mining.pii import Scrubber, contains_pii
from mining.scan import decode_line, fetch_lines
from mining.select import Selection

CATEGORIES = ("hard", "rollback", "uniform")


@dataclass
class Curated:
    holdout: list[int] = field(default_factory=list)                 # row ids
    train: dict[int, str] = field(default_factory=dict)              # row id -> category
    kept: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))  # slice -> category counts
    dropped: Counter[str] = field(default_factory=Counter)


@dataclass
class _Summary:
    key: int
    signature: Any
    needs_scrub: bool


def iter_records(files: list[Path], rows: np.ndarray) -> Iterator[tuple[int, Any]]:
    """(row id, decoded record) for the given index rows, reading each file once in file order."""
    by_file: dict[int, dict[int, int]] = defaultdict(dict)
    positions: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        by_file[int(row["file"])][int(row["line"])] = int(row["row"])
        positions[int(row["file"])].append((int(row["line"]), int(row["offset"])))
    for file_index in sorted(positions):
        for number, line in fetch_lines(files[file_index], positions[file_index]):
            yield by_file[file_index][number], decode_line(line)


def _summaries(files: list[Path], rows: np.ndarray, near: NearDupIndex, scrub: bool) -> dict[int, _Summary]:
    result = {}
    for row_id, record in iter_records(files, rows):
        text = Scrubber().scrub(record.prompt) if scrub else record.prompt
        changed = scrub and (text != record.prompt or contains_pii(record.output))
        result[row_id] = _Summary(exact_key(text), near.signature(text), changed)
    return result


def curate(files: list[Path], selection: Selection, config: MiningConfig, has_tokenizer: bool) -> Curated:
    near = NearDupIndex(config.near_dup_threshold, config.minhash_perm, config.shingle_words, seed=config.seed + 1)
    candidate_rows = [selection.holdout] + [rows for category in selection.candidates.values() for rows in category.values()]
    summaries = _summaries(files, np.concatenate(candidate_rows), near, config.scrub_pii)
    curated = Curated()
    seen: set[int] = set()

    def admit(row_id: int, origin: str) -> bool:
        summary = summaries.get(row_id)
        if summary is None:
            curated.dropped["unreadable"] += 1
            return False
        if summary.needs_scrub and not has_tokenizer:
            curated.dropped["scrubbed_without_tokenizer"] += 1
            return False
        if summary.key in seen:
            curated.dropped["exact_duplicate"] += 1
            return False
        match = near.find(summary.signature)
        if match is not None:
            curated.dropped["near_duplicate_of_holdout" if match[0] == "holdout" else "near_duplicate"] += 1
            return False
        seen.add(summary.key)
        near.add((origin, row_id), summary.signature)
        return True

    for row in selection.holdout:
        if admit(int(row["row"]), "holdout"):
            curated.holdout.append(int(row["row"]))
    for slice_id in sorted(selection.quotas):
        quota = dict(selection.quotas[slice_id])
        kept = curated.kept[slice_id]
        for category in CATEGORIES:
            if category == "uniform":
                # The anti-forgetting share follows what the hard categories actually got.
                quota["uniform"] = round(config.uniform_ratio * (kept["hard"] + kept["rollback"]))
            for row in selection.candidates[category].get(slice_id, ()):
                if kept[category] >= quota[category]:
                    break
                if admit(int(row["row"]), category):
                    curated.train[int(row["row"])] = category
                    kept[category] += 1
    return curated
