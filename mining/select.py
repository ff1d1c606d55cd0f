"""Choosing which requests become training data and which are held out, from the request index.

- Hold-out: the latest `holdout_fraction` of requests by ts (exact cut, ties included), of which a
  uniform sample of at most `holdout_max` is written. Nothing in the window is ever used for training.
  With a focus (below) the fraction is of the focus traffic: however long the logs, a round keeps most of
  its new traffic to learn from.
- Hard: per slice, the lowest-acceptance requests before the cut: the bottom `hard_quantile`
  (or acceptance <= `hard_threshold`), at most `max_hard_per_slice`, lowest first.
- Rollback: per slice, the deepest rollbacks (>= `min_rollback_depth`) not already hard, capped.
- Uniform: per slice, a uniform sample of the remaining requests, `uniform_ratio` per hard/rollback one.
- Focus: the hard, rollback and uniform samples come from the requests logged after `focus_after`
  (all, when unset): the traffic since the flywheel's last round. Hold-out and replay read every request.
- Replay: for every served slice (every slice in the logs), a uniform sample of its remaining earlier
  requests, `replay_quota` each: the same number for every slice whatever its traffic, so the slice a
  round is about does not crowd the others out of training (times `replay_boost` for a named slice).

Each list keeps distinct prompt keys and is over-sampled (`OVERSAMPLE`) so that the text-level
dedupe and PII steps downstream can drop some and still fill the quotas. Everything streams over
index chunks with per-slice buffers bounded by the caps. No text is read here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from draftwheel.mining.config import MiningConfig
from draftwheel.mining.index import ROW, IndexFile

OVERSAMPLE = 2
HOLDOUT_GROUP = -1  # the hold-out sample is drawn over all slices together, keeping the traffic mix


@dataclass
class Selection:
    cutoff: float
    holdout_window: int
    train_counts: dict[int, int]
    quotas: dict[int, dict[str, int]]
    holdout: np.ndarray
    candidates: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
    excluded_holdout_keys: int = 0


def kth_largest(index: IndexFile, k: int, lo: float, hi: float, bins: int = 4096, collect_max: int = 1 << 16) -> float:
    """The exact k-th largest ts (1-based) among rows with lo <= ts < hi, by histogram refinement.

    Each round histograms the interval into `bins` exact bins (searchsorted on the edges), finds the
    bin holding the k-th value and either collects that bin's values (few) or narrows to it.
    """
    above = 0  # rows with ts >= hi
    while True:
        edges = np.linspace(lo, hi, bins + 1)
        edges[0], edges[-1] = lo, hi
        counts = np.zeros(bins, dtype=np.int64)
        for chunk in index.chunks():
            ts = chunk["ts"][(chunk["ts"] >= lo) & (chunk["ts"] < hi)]
            counts += np.bincount(np.searchsorted(edges, ts, side="right") - 1, minlength=bins)[:bins]
        from_top = above + np.cumsum(counts[::-1])
        j = int(np.searchsorted(from_top, k))
        b = bins - 1 - j
        above_b = int(from_top[j] - counts[b])
        low, high = float(edges[b]), float(edges[b + 1])
        if (low, high) == (lo, hi):
            return lo  # the interval cannot shrink: every value in it is lo
        if counts[b] <= collect_max:
            values = np.concatenate([c["ts"][(c["ts"] >= low) & (c["ts"] < high)] for c in index.chunks()])
            return float(np.sort(values)[::-1][k - above_b - 1])
        lo, hi, above = low, high, above_b


def top_rows(index: IndexFile, quotas: dict[int, int], mask: Callable[[np.ndarray], np.ndarray],
             order: Callable[[np.ndarray], tuple]) -> dict[int, np.ndarray]:
    """Per group (slice, or HOLDOUT_GROUP for all), the first `quotas[g]` rows with distinct keys by `order`.

    `order(rows)` returns np.lexsort keys (last = primary). Buffers never exceed the quota.
    """
    best = {group: np.zeros(0, dtype=ROW) for group in quotas}
    for chunk in index.chunks():
        chunk = chunk[mask(chunk)]
        for group, quota in quotas.items():
            if quota <= 0:
                continue
            rows = chunk if group == HOLDOUT_GROUP else chunk[chunk["slice"] == group]
            if not len(rows):
                continue
            merged = np.concatenate([best[group], rows])
            merged = merged[np.lexsort(order(merged))]
            _, first = np.unique(merged["key"], return_index=True)
            best[group] = merged[np.sort(first)[:quota]]
    return best


def _by_rate(rows: np.ndarray) -> tuple:
    return rows["rand"], -rows["depth"].astype(np.int16), rows["rate"]


def _by_depth(rows: np.ndarray) -> tuple:
    return rows["rand"], rows["rate"], -rows["depth"].astype(np.int16)


def _by_rand(rows: np.ndarray) -> tuple:
    return (rows["rand"],)


def _row_ids(groups: dict[int, np.ndarray], quotas: dict[int, dict[str, int]], category: str) -> np.ndarray:
    """Row ids of the first `quota` rows of each group's list."""
    heads = [rows["row"][:quotas[group][category]] for group, rows in groups.items()]
    return np.concatenate(heads + [np.zeros(0, dtype="<u8")])


def _focus(rows: np.ndarray, cutoff: float, after: float) -> np.ndarray:
    """The rows the focus samples may take: before the hold-out cut and logged after `after`."""
    return (rows["ts"] < cutoff) & (rows["ts"] > after)


def _train_counts(index: IndexFile, cutoff: float, after: float) -> dict[int, int]:
    """Requests per slice before the hold-out cut and logged after `after`."""
    counts: dict[int, int] = {}
    for chunk in index.chunks():
        train = chunk["slice"][_focus(chunk, cutoff, after)]
        for group, count in zip(*np.unique(train, return_counts=True)):
            counts[int(group)] = counts.get(int(group), 0) + int(count)
    return counts


def _hard_quota(config: MiningConfig, count: int) -> int:
    if config.hard_threshold is not None:
        return config.max_hard_per_slice
    return min(config.max_hard_per_slice, math.ceil(config.hard_quantile * count))


def replay_quotas(config: MiningConfig, focus: int, served: list[int], boost: dict[int, float]) -> dict[int, int]:
    """Replay samples per served slice: `replay_share` of the whole mix (focus + replay), split evenly over
    the served slices, at least `replay_min_per_slice` each, times the slice's boost. 0 when the share is 0."""
    if config.replay_share <= 0 or not served:
        return {s: 0 for s in served}
    even = config.replay_share / (1.0 - config.replay_share) * focus / len(served)
    base = max(config.replay_min_per_slice, even)
    return {s: math.ceil(base * boost.get(s, 1.0)) for s in served}


def select(index: IndexFile, kept: int, ts_range: tuple[float, float], config: MiningConfig,
           boost: dict[int, float] | None = None) -> Selection:
    """Run the whole selection over the index; see the module docstring for the rules. `boost`: the
    config's `replay_boost` by slice id."""
    after = config.focus_after_ts
    after = -math.inf if after is None else after
    if after > -math.inf:  # the hold-out is the latest share of the focus traffic, never all of it
        kept = sum(int((chunk["ts"] > after).sum()) for chunk in index.chunks())
    window = math.ceil(config.holdout_fraction * kept) if kept else 0
    cutoff = math.inf
    if window:
        cutoff = kth_largest(index, window, ts_range[0], float(np.nextafter(ts_range[1], np.inf)))
    counts = _train_counts(index, cutoff, after)
    holdout = top_rows(index, {HOLDOUT_GROUP: config.holdout_max}, lambda c: c["ts"] >= cutoff, _by_rand)
    # Every slice with earlier traffic is served (replay keeps it), whether or not it has focus traffic.
    served = _train_counts(index, cutoff, -math.inf) if after > -math.inf else counts
    quotas = {s: {"hard": _hard_quota(config, counts.get(s, 0)), "rollback": config.max_rollback_per_slice}
              for s in served}
    threshold = config.hard_threshold if config.hard_threshold is not None else 1.0
    hard = top_rows(index, {s: OVERSAMPLE * q["hard"] for s, q in quotas.items()},
                    lambda c: _focus(c, cutoff, after) & (c["rate"] <= threshold), _by_rate)
    # Only the head of a list (its quota) is expected to be kept; the over-sampled tail stays available to
    # the next category, and curation skips a request a previous category already took.
    taken = _row_ids(hard, quotas, "hard")
    rollback = top_rows(index, {s: OVERSAMPLE * q["rollback"] for s, q in quotas.items()},
                        lambda c: _focus(c, cutoff, after) & (c["depth"] >= config.min_rollback_depth)
                        & ~np.isin(c["row"], taken), _by_depth)
    taken = np.concatenate([taken, _row_ids(rollback, quotas, "rollback")])
    for s, q in quotas.items():
        q["uniform"] = math.ceil(config.uniform_ratio * (q["hard"] + q["rollback"]))
    uniform = top_rows(index, {s: OVERSAMPLE * q["uniform"] for s, q in quotas.items()},
                       lambda c: _focus(c, cutoff, after) & ~np.isin(c["row"], taken), _by_rand)
    taken = np.concatenate([taken, _row_ids(uniform, quotas, "uniform")])
    focus = sum(q["hard"] + q["rollback"] + q["uniform"] for q in quotas.values())
    for s, quota in replay_quotas(config, focus, sorted(quotas), boost or {}).items():
        quotas[s]["replay"] = quota
    replay = top_rows(index, {s: OVERSAMPLE * q["replay"] for s, q in quotas.items()},
                      lambda c: (c["ts"] < cutoff) & ~np.isin(c["row"], taken), _by_rand)
    selection = Selection(cutoff=cutoff, holdout_window=window if window else 0, train_counts=counts, quotas=quotas,
                          holdout=holdout[HOLDOUT_GROUP],
                          candidates={"hard": hard, "rollback": rollback, "uniform": uniform, "replay": replay})
    _drop_holdout_keys(index, selection)
    return selection


def _drop_holdout_keys(index: IndexFile, selection: Selection) -> None:
    """Remove training candidates whose prompt key also occurs anywhere in the hold-out window."""
    groups = [rows for category in selection.candidates.values() for rows in category.values()]
    keys = np.unique(np.concatenate([rows["key"] for rows in groups] + [np.zeros(0, dtype="<u8")]))
    seen = np.zeros(0, dtype="<u8")
    for chunk in index.chunks():
        late = chunk["key"][chunk["ts"] >= selection.cutoff]
        seen = np.union1d(seen, late[np.isin(late, keys)])
    for category in selection.candidates.values():
        for group, rows in category.items():
            clash = np.isin(rows["key"], seen)
            selection.excluded_holdout_keys += int(clash.sum())
            category[group] = rows[~clash]
