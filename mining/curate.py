"""From selected candidates to the final sample lists: text-level dedupe, hold-out isolation, quotas.

Candidates are read lazily, in rounds: each round reads (in file order) just enough of every slice's
candidate list to fill what its quota still lacks, and keeps a small summary per candidate (MinHash
signature, normalised-text key, whether scrubbing would change it). Candidates are then admitted in
priority order -- hold-out first, then hard, rollback, uniform and replay samples (each per slice,
best first) -- unless they are an exact or near duplicate of something admitted before (the hold-out
included, so no training prompt resembles a hold-out prompt), or need scrubbing, or lack token ids (a
record from another engine), while no tokenizer is there to derive their ids. The uniform and replay quotas follow what the categories before them
actually kept. Writing the datasets is `draftwheel.mining.outputs`' job.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftwheel.mining.config import MiningConfig
from draftwheel.mining.dedupe import NearDupIndex, exact_key
from draftwheel.mining.pii import Scrubber, contains_pii
from draftwheel.mining.log_reader import fetch_lines
from draftwheel.mining.select import Selection, replay_quotas
from draftwheel.serving.engine.records import RecordError, read_record

CATEGORIES = ("hard", "rollback", "uniform", "replay")
FOCUS = CATEGORIES[:3]


@dataclass
class Curated:
    holdout: list[int] = field(default_factory=list)                 # row ids
    train: dict[int, str] = field(default_factory=dict)              # row id -> category
    kept: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))  # slice -> category counts
    dropped: Counter[str] = field(default_factory=Counter)
    replay_quotas: dict[int, int] = field(default_factory=dict)  # slice -> replay quota (on kept counts)


@dataclass
class _Summary:
    key: int
    signature: Any
    needs_scrub: bool
    needs_ids: bool = False
    """A record from another engine that logged text without token ids: they come from the tokenizer."""


def iter_records(files: list[Path], rows: np.ndarray) -> Iterator[tuple[int, Any]]:
    """(row id, decoded record) for the given index rows, reading each file once in file order.

    A line that no longer decodes to the indexed request (the active log rotated or was rewritten
    since the scan) is skipped, so the caller sees it as unreadable instead of mining a stranger."""
    by_file: dict[int, dict[int, tuple[int, int]]] = defaultdict(dict)
    positions: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        by_file[int(row["file"])][int(row["line"])] = (int(row["row"]), int(row["key"]))
        positions[int(row["file"])].append((int(row["line"]), int(row["offset"])))
    for file_index in sorted(positions):
        for number, line in fetch_lines(files[file_index], positions[file_index]):
            row_id, key = by_file[file_index][number]
            try:
                record = read_record(line)
            except RecordError:
                continue
            if exact_key(record.prompt) == key:
                yield row_id, record


class _Curator:
    def __init__(self, files: list[Path], config: MiningConfig, has_tokenizer: bool):
        self.files = files
        self.config = config
        self.has_tokenizer = has_tokenizer
        self.near = NearDupIndex(config.near_dup_threshold, config.minhash_perm, config.shingle_words,
                                 seed=config.seed + 1)
        self.summaries: dict[int, _Summary] = {}
        self.seen: set[int] = set()
        self.result = Curated()

    def summarize(self, rows: np.ndarray) -> None:
        for row_id, record in iter_records(self.files, rows):
            text = Scrubber().scrub(record.prompt) if self.config.scrub_pii else record.prompt
            changed = self.config.scrub_pii and (text != record.prompt or contains_pii(record.output))
            lacks_ids = not record.prompt_token_ids or (bool(record.output) and not record.output_token_ids)
            self.summaries[row_id] = _Summary(exact_key(text), self.near.signature(text), changed, lacks_ids)

    def admit(self, row_id: int, origin: str) -> bool:
        summary = self.summaries.get(row_id)
        dropped = self.result.dropped
        if summary is None:
            dropped["unreadable"] += 1
        elif summary.needs_scrub and not self.has_tokenizer:
            dropped["scrubbed_without_tokenizer"] += 1
        elif summary.needs_ids and not self.has_tokenizer:
            dropped["no_token_ids_without_tokenizer"] += 1
        elif summary.key in self.seen:
            dropped["exact_duplicate"] += 1
        elif (match := self.near.find(summary.signature)) is not None:
            dropped["near_duplicate_of_holdout" if match[0] == "holdout" else "near_duplicate"] += 1
        else:
            self.seen.add(summary.key)
            self.near.add((origin, row_id), summary.signature)
            return True
        return False

    def fill(self, category: str, lists: dict[int, np.ndarray], quotas: dict[int, int]) -> None:
        """Admit candidates of every slice in order until its quota is met or its list runs out."""
        cursor = {s: 0 for s in lists}
        kept = self.result.kept
        while True:
            need = {s: quotas[s] - kept[s][category] for s in lists
                    if kept[s][category] < quotas[s] and cursor[s] < len(lists[s])}
            if not need:
                return
            batch = {s: lists[s][cursor[s]:cursor[s] + need[s]] for s in need}
            self.summarize(np.concatenate(list(batch.values())))
            for s, rows in batch.items():
                cursor[s] += len(rows)
                for row_id in rows["row"].tolist():
                    if row_id in self.result.train:  # an earlier category's over-sampled tail took it
                        continue
                    if kept[s][category] < quotas[s] and self.admit(row_id, category):
                        self.result.train[row_id] = category
                        kept[s][category] += 1


def _quotas(category: str, selection: Selection, kept: dict[int, Counter[str]], config: MiningConfig,
            boost: dict[int, float]) -> dict[int, int]:
    """A category's per-slice quotas; uniform and replay follow what the categories before them kept."""
    if category == "uniform":
        return {s: round(config.uniform_ratio * (kept[s]["hard"] + kept[s]["rollback"])) for s in selection.quotas}
    if category == "replay":
        focus = sum(kept[s][c] for s in selection.quotas for c in FOCUS)
        return replay_quotas(config, focus, sorted(selection.quotas), boost)
    return {s: q[category] for s, q in selection.quotas.items()}


def curate(files: list[Path], selection: Selection, config: MiningConfig, has_tokenizer: bool,
           boost: dict[int, float] | None = None) -> Curated:
    """Admit the hold-out, then each category's candidates up to its quotas (`boost`: replay_boost by slice id)."""
    curator = _Curator(files, config, has_tokenizer)
    curator.summarize(selection.holdout)
    curator.result.holdout = [r for r in selection.holdout["row"].tolist() if curator.admit(r, "holdout")]
    for category in CATEGORIES:
        quotas = _quotas(category, selection, curator.result.kept, config, boost or {})
        if category == "replay":
            curator.result.replay_quotas = quotas
        lists = {s: selection.candidates.get(category, {}).get(s, selection.holdout[:0]) for s in quotas}
        curator.fill(category, lists, quotas)
    return curator.result
