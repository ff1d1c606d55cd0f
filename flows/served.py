"""Per-slice figures of what serving delivered, from acceptance records: the monitor's window statistics
and the delivered gain of a promotion.

- `SliceStats` / `acceptance_by_slice`: token-weighted counts per slice and "overall"; the figures come
  from `draftwheel.serving.engine.acceptance` (the one definition of acceptance rate and mean accepted length).
- `VersionTally.watch(records)`: passes records through unchanged while counting, per draft version,
  the drafted records each version served (the draft's own steps), and every step of every request it
  served (`as_served`: the hybrid's suffix-index and plain steps too), so the monitor reads the logs once.
- `delivered_gain(tally, champion, previous)`: the champion's live acceptance rate and mean accepted
  length per slice against the previous champion's, with the relative change where both served the slice
  and its bootstrap confidence interval (`mal_change_interval`: the two champions served different
  requests, so each arm is resampled on its own; two samples of 40 code requests on one draft read 1.522
  and 1.452, and a point estimate alone hides that). "overall" compares the two at the champion's
  slice mix (`same_mix_change`), so a shift of traffic between slices is not reported as a gain.
- `delivered_metrics(gain)`: the same as flat MLflow metric names.

Plain functions: no MLflow, no registry, no Prefect; `draftwheel.flows.monitor` logs and records the results.
"""

from __future__ import annotations

import re
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np

from draftwheel.serving.engine.acceptance import acceptance_rate, mean_accepted_length
from draftwheel.serving.engine.records import AcceptanceRecord, draft_counts

# Records without the draft model (plain decoding, suffix only) say nothing about the draft; of a hybrid
# record only the steps the draft drafted count (draftwheel.serving.engine.records.draft_counts).
DRAFTING_MODES = ("draft", "medusa", "hybrid")


def is_drafted(record: AcceptanceRecord) -> bool:
    return record.mode in DRAFTING_MODES and draft_counts(record)[0] > 0


@dataclass
class SliceStats:
    every_step: bool = False
    """Count every step of a record (the request as served: suffix-index and plain steps too), not only
    the draft's own (`draft_counts`)."""
    requests: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    request_accepted: array = field(default_factory=lambda: array("q"), repr=False)
    request_steps: array = field(default_factory=lambda: array("q"), repr=False)
    """Per request, what a confidence interval resamples (8 bytes each: a million requests is 16 MB)."""

    def add(self, record: AcceptanceRecord) -> None:
        if self.every_step:
            drafted, accepted, steps = record.drafted_tokens, record.accepted_tokens, record.verify_steps
        else:
            drafted, accepted, steps = draft_counts(record)
        self.requests += 1
        self.drafted += drafted
        self.accepted += accepted
        self.steps += steps
        self.request_accepted.append(accepted)
        self.request_steps.append(steps)

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def mean_accepted_length(self) -> float:
        return mean_accepted_length(self.accepted, self.steps)

    def figures(self) -> dict[str, float]:
        return {"requests": self.requests, "acceptance_rate": self.acceptance_rate,
                "mean_accepted_length": self.mean_accepted_length}


def _count(stats: dict[str, SliceStats], record: AcceptanceRecord, every_step: bool = False) -> None:
    """Add `record` to its slice's stats and to "overall"'s."""
    for key in ("overall", record.slice):
        stats.setdefault(key, SliceStats(every_step=every_step)).add(record)


def acceptance_by_slice(records: Iterable[AcceptanceRecord], every_step: bool = False) -> dict[str, SliceStats]:
    """Token-weighted acceptance per slice and "overall" (a long request counts for its tokens): of the
    draft's own steps, or with `every_step` of every step of each request (the figures as served)."""
    stats: dict[str, SliceStats] = {"overall": SliceStats(every_step=every_step)}
    for record in records:
        _count(stats, record, every_step)
    return stats


class VersionTally:
    """Counts, per draft version (of the registered model `name`), as records stream past: the draft's own
    steps of the records it drafted (`by_version`), and every step of every record served with it
    (`as_served`). The two differ for the hybrid, where the suffix index drafts most steps on code (on a
    shift to code, a round that raised the draft's own mean accepted length by 42 % moved the hybrid's
    by 1-3 %)."""

    def __init__(self, name: str, versions: Iterable[str]):
        self.name = name
        self.by_version: dict[str, dict[str, SliceStats]] = {str(v): {"overall": SliceStats()} for v in versions}
        self.as_served: dict[str, dict[str, SliceStats]] = {
            str(v): {"overall": SliceStats(every_step=True)} for v in versions}

    def watch(self, records: Iterable[AcceptanceRecord]) -> Iterator[AcceptanceRecord]:
        for record in records:
            draft = record.draft_id
            if (draft is not None and draft.name == self.name and draft.version in self.by_version
                    and record.mode in DRAFTING_MODES):
                _count(self.as_served[draft.version], record, every_step=True)
                if is_drafted(record):
                    _count(self.by_version[draft.version], record)
            yield record


def _change(new: float, old: float) -> float | None:
    return new / old - 1.0 if old else None


RESAMPLES = 2000
MAX_RESAMPLED_REQUESTS = 10_000  # per arm and slice: a seeded subsample beyond this bounds the work (a wider interval)
_CHUNK = 100  # resamples drawn at once: [100, 10k] int64 indices are 8 MB


def _resampled_sums(stats: SliceStats, rng: np.random.Generator, resamples: int) -> tuple[np.ndarray, np.ndarray]:
    """(accepted tokens, verification steps) summed over each of `resamples` bootstrap resamples of the
    requests in `stats`."""
    accepted = np.asarray(stats.request_accepted, dtype=np.int64)
    steps = np.asarray(stats.request_steps, dtype=np.int64)
    if len(steps) > MAX_RESAMPLED_REQUESTS:
        keep = rng.choice(len(steps), MAX_RESAMPLED_REQUESTS, replace=False)
        accepted, steps = accepted[keep], steps[keep]
    sums = [(accepted[rows].sum(1), steps[rows].sum(1))
            for rows in (rng.integers(0, len(steps), size=(min(_CHUNK, resamples - start), len(steps)))
                         for start in range(0, resamples, _CHUNK))]
    return np.concatenate([a for a, _ in sums]), np.concatenate([n for _, n in sums])


def _mal(accepted: Any, steps: Any) -> Any:
    """draftwheel.serving.engine.acceptance.mean_accepted_length, elementwise over arrays too."""
    return (accepted + steps) / np.maximum(steps, 1)


def _at_champions_mix(pairs: list[tuple[SliceStats, SliceStats]], total: Any, weight: Any, figure: Any) -> float | None:
    """Relative change of a ratio figure (`total(stats) / weight(stats)` per slice, e.g. mean accepted
    length = (accepted + steps) / steps) from the previous champion to the champion, over `pairs` =
    [(champion's, previous') per slice], with the previous champion's per-slice `figure` weighted by the
    champion's own `weight` per slice. The shared weight sum cancels: Σ total(ours) / Σ weight(ours)·figure(theirs)."""
    if not sum(weight(ours) for ours, _ in pairs):
        return None
    return _change(sum(total(ours) for ours, _ in pairs), sum(weight(ours) * figure(theirs) for ours, theirs in pairs))


def same_mix_change(pairs: list[tuple[SliceStats, SliceStats]]) -> float | None:
    """Relative change in mean accepted length from the previous champion to the champion over the slices
    both served, `pairs` = [(champion's, previous') per slice]: the previous champion's per-slice figures
    weighted by the champion's own verification steps per slice. For one slice, the plain ratio; for
    several, traffic that shifted between slices does not pass for a gain (a shift to code: v1 served chat at
    2.83 and code at 1.11, v2 served only code, and the raw overall ratio read +27 % where code gained +37 %)."""
    return _at_champions_mix(pairs, lambda s: s.accepted + s.steps, lambda s: s.steps, lambda s: s.mean_accepted_length)


def mal_change_interval(pairs: list[tuple[SliceStats, SliceStats]], confidence: float = 0.95,
                        resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `same_mix_change(pairs)`: unpaired (two champions served different
    requests), each arm's requests resampled on their own within each slice (stratified), seeded. None when
    an arm of a slice has fewer than 2 requests (nothing to resample)."""
    if not pairs or min(min(len(o.request_steps), len(t.request_steps)) for o, t in pairs) < 2:
        return None
    rng = np.random.default_rng(seed)
    ours_tokens = theirs_weighted = 0  # per resample, as in `_at_champions_mix`
    for ours, theirs in pairs:
        accepted, steps = _resampled_sums(ours, rng, resamples)
        before = _mal(*_resampled_sums(theirs, rng, resamples))
        ours_tokens, theirs_weighted = ours_tokens + accepted + steps, theirs_weighted + steps * before
    changes = ours_tokens / np.where(theirs_weighted > 0, theirs_weighted, np.nan) - 1.0
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.nanpercentile(changes, [tail, 100 - tail])
    return float(low), float(high)


def _same_mix_acceptance_change(pairs: list[tuple[SliceStats, SliceStats]]) -> float | None:
    """As `same_mix_change`, for the acceptance rate (weights: the champion's drafted tokens per slice)."""
    return _at_champions_mix(pairs, lambda s: s.accepted, lambda s: s.drafted, lambda s: s.acceptance_rate)


def delivered_gain(tally: VersionTally, champion: str, previous: str | None,
                   confidence: float = 0.95) -> dict[str, Any]:
    """{"champion", "previous", "confidence", "slices": {slice|"overall": {"champion": figures, "previous":
    figures|None, "mal_change", "mal_change_ci": [low, high]|None, "acceptance_change"}}, "as_served": the
    same over every step of the requests}; a change is None where the previous champion did not serve the
    slice. "overall"'s changes are over the slices both served, at the champion's mix (`same_mix_change`;
    its entry lists them as "compared_slices"); its figures are the raw ones."""
    def arm(tallies: dict[str, dict[str, SliceStats]], version: str | None) -> dict[str, SliceStats]:
        return tallies.get(str(version), {}) if version else {}

    return {"champion": str(champion), "previous": previous, "confidence": confidence,
            "slices": _compare(arm(tally.by_version, champion), arm(tally.by_version, previous), confidence),
            "as_served": _compare(arm(tally.as_served, champion), arm(tally.as_served, previous), confidence),
            "created": time.time()}


def _compare(ours: dict[str, SliceStats], theirs: dict[str, SliceStats], confidence: float) -> dict[str, Any]:
    """`delivered_gain`'s per-slice entries for one way of counting."""
    def served(stats: SliceStats | None) -> bool:
        return stats is not None and stats.requests > 0

    both = sorted(name for name in ours if name != "overall" and served(ours[name]) and served(theirs.get(name)))
    slices = {}
    for name, stats in sorted(ours.items()):
        if not stats.requests:
            continue
        before = theirs.get(name) if served(theirs.get(name)) else None
        compared = both if name == "overall" else [name] if before else []
        pairs = [(ours[s], theirs[s]) for s in compared]
        interval = mal_change_interval(pairs, confidence) if pairs else None
        slices[name] = {"champion": stats.figures(), "previous": before.figures() if before else None,
                        "mal_change": same_mix_change(pairs) if pairs else None,
                        "mal_change_ci": list(interval) if interval else None,
                        "acceptance_change": _same_mix_acceptance_change(pairs) if pairs else None}
        if name == "overall":
            slices[name]["compared_slices"] = compared
    return slices


def delivered_metrics(gain: dict[str, Any]) -> dict[str, float]:
    """`delivered.<slice>.<arm>_<figure>` and `delivered.<slice>.<figure>_change` for MLflow; the
    as-served figures under `delivered_as_served.`."""
    metrics = {}
    for prefix, key in (("delivered", "slices"), ("delivered_as_served", "as_served")):
        for slice_name, entry in gain.get(key, {}).items():
            name = prefix + "." + re.sub(r"[^\w\-. /]", "_", slice_name)  # MLflow's allowed metric-name characters
            for arm in ("champion", "previous"):
                for figure, value in (entry[arm] or {}).items():
                    metrics[f"{name}.{arm}_{figure}"] = value
            for figure in ("mal_change", "acceptance_change"):
                if entry[figure] is not None:
                    metrics[f"{name}.{figure}"] = entry[figure]
            if entry.get("mal_change_ci"):
                metrics[f"{name}.mal_change_low"], metrics[f"{name}.mal_change_high"] = entry["mal_change_ci"]
    return metrics
