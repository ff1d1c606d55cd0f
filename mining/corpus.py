"""The retained corpus: what the flywheel has learned from, kept across rounds.

Each round mines one window of serving logs; without a memory, round n's draft has seen round n's traffic
(plus whatever its replay and rehearsal shares happen to pick), so what earlier rounds taught is kept only
by chance. The corpus keeps every round's mined `distill/` rows -- already PII-scrubbed and de-duplicated
by mining -- in one dataset under the state dir, bounded:

- de-duplicated across rounds by prompt (draftwheel.mining.dedupe.exact_key): a prompt seen again keeps its newest row;
- at most `max_per_slice` rows per slice, the newest kept;
- rows older than `max_age_days` dropped (0 = no age limit).

`retain` adds a round's rows; `mix_into` samples earlier rounds' rows (prompts not in this round's set),
`ratio` per mined row, into the round's training set, so round n trains on rounds 1..n. The corpus also
remembers the newest request a round mined (`mined_until`): the next round's focus samples start after it
(mining's `focus_after`), so a round's mined set is its own traffic and its training time does not grow
with all the logs served so far. The bootstrap
data is not in it: trainers rehearse that themselves. Writes are atomic (a new dir, then a rename).
No models, no tracking here.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftwheel.mining.dedupe import exact_key

ADDED = "corpus_added_ts"
"""Column: when a row joined the corpus (seconds since the epoch)."""
MARK = "mined_until.json"
"""File in the corpus dir: {"ts": the newest request ts a round mined}."""


@dataclass
class CorpusPolicy:
    """Bounds of the retained corpus (the flywheel's `corpus_*` settings)."""

    max_per_slice: int = 2000
    max_age_days: float = 90.0
    ratio: float = 1.0
    """Earlier rounds' rows mixed into a round's training set, per row the round mined."""

    def __post_init__(self) -> None:
        if self.max_per_slice < 1:
            raise ValueError(f"corpus_max_per_slice: must be >= 1, got {self.max_per_slice!r}")
        if self.max_age_days < 0:
            raise ValueError(f"corpus_max_age_days: must be >= 0 (0 = no limit), got {self.max_age_days!r}")
        if self.ratio < 0:
            raise ValueError(f"corpus_ratio: must be >= 0, got {self.ratio!r}")


def _load(path: Path) -> Any:
    from datasets import load_from_disk

    return load_from_disk(str(path)) if path.is_dir() else None


def _save(dataset: Any, path: Path) -> None:
    """Write `dataset` to `path` atomically: to a sibling dir first, then swap it in."""
    fresh = path.with_name(path.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    dataset.save_to_disk(str(fresh))
    old = path.with_name(path.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    fresh.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def _bounded(rows: list[dict[str, Any]], policy: CorpusPolicy, now: float) -> list[dict[str, Any]]:
    """Newest first: one row per prompt, none past the age limit, at most max_per_slice per slice."""
    oldest = now - policy.max_age_days * 86400 if policy.max_age_days else float("-inf")
    kept, seen, per_slice = [], set(), Counter()
    for row in sorted(rows, key=lambda r: -r[ADDED]):
        key = exact_key(row["prompt"])
        if key in seen or row[ADDED] < oldest or per_slice[row["slice"]] >= policy.max_per_slice:
            continue
        seen.add(key)
        per_slice[row["slice"]] += 1
        kept.append(row)
    return kept


def retain(corpus_dir: str | Path, distill_dir: str | Path, policy: CorpusPolicy,
           now: float | None = None, newest_ts: float | None = None) -> dict[str, int]:
    """Add a round's mined distill rows to the corpus, apply the bounds; return rows per slice.
    `newest_ts`: the newest request the round mined, kept as the corpus's `mined_until` (never moved back)."""
    from datasets import Dataset

    corpus_dir, now = Path(corpus_dir), time.time() if now is None else now
    new = [{**row, ADDED: now} for row in _load(Path(distill_dir)) or []]
    old = _load(corpus_dir)
    marks = [ts for ts in (mined_until(corpus_dir), newest_ts) if ts is not None]
    rows = _bounded(new + (old.to_list() if old is not None else []), policy, now)
    if rows:
        _save(Dataset.from_list(rows), corpus_dir)
        if marks:
            (corpus_dir / MARK).write_text(json.dumps({"ts": max(marks)}) + "\n")
    return dict(sorted(Counter(row["slice"] for row in rows).items()))


def mined_until(corpus_dir: str | Path) -> float | None:
    """The newest request ts a round retained into this corpus mined (None: no round yet)."""
    path = Path(corpus_dir) / MARK
    return float(json.loads(path.read_text())["ts"]) if path.is_file() else None


def sizes(corpus_dir: str | Path) -> dict[str, int]:
    """Rows per slice of the corpus ({} when there is none)."""
    corpus = _load(Path(corpus_dir))
    return dict(sorted(Counter(corpus["slice"]).items())) if corpus is not None else {}


def mix_into(distill_dir: str | Path, corpus_dir: str | Path, policy: CorpusPolicy, seed: int = 0) -> int:
    """Append a seeded sample of the corpus's rows whose prompt is not in `distill_dir` (earlier rounds'
    traffic), `policy.ratio` per row already there, to that dataset; return how many were added."""
    from datasets import concatenate_datasets

    distill_dir = Path(distill_dir)
    mined, corpus = _load(distill_dir), _load(Path(corpus_dir))
    if mined is None or corpus is None or not policy.ratio:
        return 0
    present = {exact_key(prompt) for prompt in mined["prompt"]}
    earlier = [i for i, prompt in enumerate(corpus["prompt"]) if exact_key(prompt) not in present]
    n = min(len(earlier), round(policy.ratio * len(mined)))
    if not n:
        return 0
    picked = sorted(random.Random(seed).sample(earlier, n))
    extra = corpus.select(picked).remove_columns([ADDED]).cast(mined.features)
    _save(concatenate_datasets([mined, extra]), distill_dir)
    return n
