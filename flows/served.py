"""Per-slice figures of what serving delivered, from acceptance records: the monitor's window statistics
and the delivered gain of a promotion.

- `SliceStats` / `acceptance_by_slice`: token-weighted counts per slice and "overall"; the figures come
  from `serving.acceptance` (the one definition of acceptance rate and mean accepted length).
- `VersionTally.watch(records)`: passes records through unchanged while counting, per draft version,
  the drafted records each version served, so the monitor reads the logs once.
- `delivered_gain(tally, champion, previous)`: the champion's live acceptance rate and mean accepted
  length per slice against the previous champion's, with the relative change where both served the slice.
- `delivered_metrics(gain)`: the same as flat MLflow metric names.

Plain functions: no MLflow, no registry, no Prefect; `flows.monitor` logs and records the results.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from serving.acceptance import acceptance_rate, mean_accepted_length
from serving.records import AcceptanceRecord, draft_counts

# Records without the draft model (plain decoding, suffix only) say nothing about the draft; of a hybrid
# record only the steps the draft drafted count (serving.records.draft_counts).
DRAFTING_MODES = ("draft", "medusa", "hybrid")


def is_drafted(record: AcceptanceRecord) -> bool:
    return record.mode in DRAFTING_MODES and draft_counts(record)[0] > 0


@dataclass
class SliceStats:
    requests: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0

    def add(self, record: AcceptanceRecord) -> None:
        drafted, accepted, steps = draft_counts(record)
        self.requests += 1
        self.drafted += drafted
        self.accepted += accepted
        self.steps += steps

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def mean_accepted_length(self) -> float:
        return mean_accepted_length(self.accepted, self.steps)

    def figures(self) -> dict[str, float]:
        return {"requests": self.requests, "acceptance_rate": self.acceptance_rate,
                "mean_accepted_length": self.mean_accepted_length}


def acceptance_by_slice(records: Iterable[AcceptanceRecord]) -> dict[str, SliceStats]:
    """Token-weighted acceptance per slice and "overall" (a long request counts for its tokens)."""
    stats: dict[str, SliceStats] = {"overall": SliceStats()}
    for record in records:
        for key in ("overall", record.slice):
            stats.setdefault(key, SliceStats()).add(record)
    return stats


class VersionTally:
    """Counts drafted records per draft version (of the registered model `name`) as they stream past."""

    def __init__(self, name: str, versions: Iterable[str]):
        self.name = name
        self.by_version: dict[str, dict[str, SliceStats]] = {str(v): {"overall": SliceStats()} for v in versions}

    def watch(self, records: Iterable[AcceptanceRecord]) -> Iterator[AcceptanceRecord]:
        for record in records:
            draft = record.draft_id
            if draft is not None and draft.name == self.name and draft.version in self.by_version and is_drafted(record):
                stats = self.by_version[draft.version]
                for key in ("overall", record.slice):
                    stats.setdefault(key, SliceStats()).add(record)
            yield record


def _change(new: float, old: float) -> float | None:
    return new / old - 1.0 if old else None


def delivered_gain(tally: VersionTally, champion: str, previous: str | None) -> dict[str, Any]:
    """{"champion", "previous", "slices": {slice|"overall": {"champion": figures, "previous": figures|None,
    "mal_change", "acceptance_change"}}}; a change is None where the previous champion did not serve the slice."""
    ours = tally.by_version.get(str(champion), {})
    theirs = tally.by_version.get(str(previous), {}) if previous else {}
    slices = {}
    for name, stats in sorted(ours.items()):
        if not stats.requests:
            continue
        before = theirs.get(name)
        before = before if before is not None and before.requests else None
        slices[name] = {"champion": stats.figures(), "previous": before.figures() if before else None,
                        "mal_change": _change(stats.mean_accepted_length, before.mean_accepted_length) if before else None,
                        "acceptance_change": _change(stats.acceptance_rate, before.acceptance_rate) if before else None}
    return {"champion": str(champion), "previous": previous, "slices": slices, "created": time.time()}


def delivered_metrics(gain: dict[str, Any]) -> dict[str, float]:
    """`delivered.<slice>.<arm>_<figure>` and `delivered.<slice>.<figure>_change` for MLflow."""
    metrics = {}
    for slice_name, entry in gain["slices"].items():
        name = re.sub(r"[^\w\-. /]", "_", slice_name)  # MLflow's allowed metric-name characters
        for arm in ("champion", "previous"):
            for key, value in (entry[arm] or {}).items():
                metrics[f"delivered.{name}.{arm}_{key}"] = value
        for key in ("mal_change", "acceptance_change"):
            if entry[key] is not None:
                metrics[f"delivered.{name}.{key}"] = entry[key]
    return metrics
