"""Per-request and per-slice acceptance statistics.

Per request (`request_stats`), over the steps the draft model drafted (a hybrid record's suffix-index
steps are the index's, `draftwheel.serving.engine.records.draft_counts`): acceptance rate and mean accepted length (`draftwheel.serving.engine.acceptance`, the
one definition; a request that drafted nothing gets rate NaN here, so it is neither a hard sample nor in
the acceptance histogram), max rollback depth (max over steps of k - accepted). Per slice (`SliceStats`): counts,
token-weighted rates, a 100-bin histogram of request acceptance (for quantiles and the plot), a
rollback-depth histogram and per-position acceptance (drafted/accepted counts at each draft
position, positions past 63 folded into 63). Everything is O(1) memory per slice, whatever the log size. No I/O here.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from draftwheel.serving.engine.acceptance import acceptance_rate, mean_accepted_length
from draftwheel.serving.engine.records import SUFFIX, draft_counts, draft_steps

BINS = 100
MAX_DEPTH = 255  # rollback depths are stored as uint8; k is at most 32 in serving.


def request_stats(record: Any) -> tuple[float, float, int, list[int]]:
    """(acceptance rate or NaN without drafts, mean accepted length, max rollback depth, step codes).

    A step code packs (k, accepted) as k * 64 + accepted (both clipped to 63), so per-position counts
    can be histogrammed in bulk by `SliceStats` instead of per step in Python.
    """
    drafted, accepted, verify_steps = draft_counts(record)  # the draft's own steps: mining trains the draft
    rate = acceptance_rate(accepted, drafted) if drafted else math.nan
    length = mean_accepted_length(accepted, verify_steps)
    steps = draft_steps(record)
    depth = max([s.k - s.accepted for s in steps], default=0)
    codes = [s.k * 64 + s.accepted for s in steps]
    # accepted <= k, so a code >= 4096 means some k >= 64: clip (rare, slower path).
    if codes and max(codes) >= 64 * 64:
        codes = [min(s.k, 63) * 64 + min(s.accepted, 63) for s in steps]
    return rate, length, min(depth, MAX_DEPTH), codes


def suffix_served_length(record: Any) -> float:
    """Mean accepted length (bonus included) of the record's steps the suffix index drafted
    (`source == "suffix"`); 0.0 when it drafted none."""
    suffix = [s for s in record.steps if s.source == SUFFIX]
    return mean_accepted_length(sum(s.accepted for s in suffix), len(suffix))


def _quantile(hist: np.ndarray, q: float) -> float | None:
    """Upper edge of the histogram bin holding the q-quantile (bin width 1/BINS)."""
    total = hist.sum()
    if total == 0:
        return None
    return float((np.searchsorted(np.cumsum(hist), q * total) + 1) / len(hist))


class SliceStats:
    """Accumulates one slice's requests; `to_dict()` is what the manifest shows."""

    def __init__(self) -> None:
        self.requests = 0
        self.with_drafts = 0
        self.drafted = 0
        self.accepted = 0
        self.verify_steps = 0
        self.generated = 0
        self.rate_sum = 0.0
        self.rate_hist = np.zeros(BINS, dtype=np.int64)
        self.depth_hist = np.zeros(MAX_DEPTH + 1, dtype=np.int64)
        self.step_codes = np.zeros(64 * 64, dtype=np.int64)  # histogram of k * 64 + accepted
        self._pending: list[int] = []
        self.modes: Counter[str] = Counter()

    def add(self, record: Any, rate: float, depth: int, codes: list[int]) -> None:
        self.requests += 1
        self.modes[record.mode] += 1
        drafted, accepted, verify_steps = draft_counts(record)
        self.drafted += drafted
        self.accepted += accepted
        self.verify_steps += verify_steps
        self.generated += len(record.output_token_ids)
        self.depth_hist[depth] += 1
        self._pending += codes
        if len(self._pending) > 1 << 16:
            self._flush()
        if not math.isnan(rate):
            self.with_drafts += 1
            self.rate_sum += rate
            self.rate_hist[min(int(rate * BINS), BINS - 1)] += 1

    def merge(self, other: SliceStats) -> None:
        """Add another accumulator's counts (the parts of a parallel scan)."""
        other._flush()
        self._flush()
        for name in ("requests", "with_drafts", "drafted", "accepted", "verify_steps", "generated", "rate_sum"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("rate_hist", "depth_hist", "step_codes"):
            getattr(self, name)[:] += getattr(other, name)
        self.modes.update(other.modes)

    def _flush(self) -> None:
        if self._pending:
            self.step_codes += np.bincount(np.asarray(self._pending, dtype=np.int64), minlength=64 * 64)
            self._pending = []

    def per_position(self) -> list[float]:
        """Acceptance at draft position i: accepted at i / drafted at i, over all steps."""
        self._flush()
        counts = self.step_codes.reshape(64, 64)  # [k, accepted]
        ks = np.nonzero(counts.sum(axis=1))[0]
        max_k = int(ks[-1]) if len(ks) else 0
        drafted = np.zeros(max_k, dtype=np.int64)
        accepted = np.zeros(max_k, dtype=np.int64)
        for k, taken in zip(*np.nonzero(counts)):
            drafted[:k] += counts[k, taken]
            accepted[:taken] += counts[k, taken]
        return [round(float(a / d), 6) if d else 0.0 for a, d in zip(accepted, drafted)]

    def to_dict(self) -> dict[str, Any]:
        depths = np.nonzero(self.depth_hist)[0]
        return {
            "requests": self.requests,
            "requests_with_drafts": self.with_drafts,
            "modes": dict(self.modes),
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "verify_steps": self.verify_steps,
            "generated_tokens": self.generated,
            "acceptance_rate": acceptance_rate(self.accepted, self.drafted),
            # Rounded: float sums depend on order, and parallel scans add in another order.
            "mean_request_acceptance_rate": round(self.rate_sum / self.with_drafts, 9) if self.with_drafts else None,
            "mean_accepted_length": mean_accepted_length(self.accepted, self.verify_steps),
            "acceptance_p10": _quantile(self.rate_hist, 0.1),
            "acceptance_p50": _quantile(self.rate_hist, 0.5),
            "acceptance_p90": _quantile(self.rate_hist, 0.9),
            "max_rollback_depth": int(depths[-1]) if len(depths) else 0,
            "mean_max_rollback_depth": float((self.depth_hist * np.arange(MAX_DEPTH + 1)).sum() / self.requests)
            if self.requests else None,
            "per_position_acceptance": self.per_position(),
            "acceptance_histogram": self.rate_hist.tolist(),
        }
