"""Dedupe (exact and MinHash near-duplicates) and the index-based selection rules."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from draftwheel.mining.config import MiningConfig
from draftwheel.mining.dedupe import NearDupIndex, exact_key
from draftwheel.mining.index import ROW, IndexFile
from draftwheel.mining.select import OVERSAMPLE, kth_largest, select


def _words(rng: random.Random, n: int) -> list[str]:
    return [f"w{rng.randrange(2000)}" for _ in range(n)]


def test_exact_key_ignores_case_and_whitespace_only():
    assert exact_key("Hello  World\n") == exact_key("hello world")
    assert exact_key("hello world") != exact_key("hello world!")


def test_near_duplicates_are_found_and_distinct_texts_are_not():
    rng = random.Random(0)
    base = _words(rng, 300)
    index = NearDupIndex(threshold=0.8, num_perm=128)
    index.add("base", index.signature(" ".join(base)))
    edited = list(base)
    for i in range(0, 300, 60):  # 5 single-word edits: ~95% of 3-grams survive
        edited[i] = "changed"
    assert index.find(index.signature(" ".join(edited))) == "base"
    assert index.find(index.signature(" ".join(_words(rng, 300)))) is None
    # Half the text replaced: Jaccard ~ 1/3, well under the threshold.
    assert index.find(index.signature(" ".join(base[:150] + _words(rng, 150)))) is None


def _index(tmp_path, rows: list[tuple]) -> IndexFile:
    index = IndexFile(tmp_path / "index.bin")
    for row in rows:
        index.append(row)
    index.close()
    return index


def _rows(n: int, slices: int = 3, seed: int = 0, dup_every: int = 0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        key = i // dup_every if dup_every else i
        rows.append((i, 0, i + 1, i * 100, 1000.0 + rng.integers(0, n // 2), i % slices, float(rng.random()),
                     int(rng.integers(0, 5)), key, int(rng.integers(0, 2**63))))
    return rows


@pytest.mark.parametrize("k", [1, 7, 500, 999, 1000])
def test_kth_largest_is_exact_with_ties(tmp_path, k):
    index = _index(tmp_path, _rows(1000))
    ts = np.array([r[4] for r in _rows(1000)])
    expected = np.sort(ts)[::-1][k - 1]
    assert kth_largest(index, k, float(ts.min()), float(np.nextafter(ts.max(), np.inf)), bins=16, collect_max=8) == expected


def test_holdout_is_the_latest_fraction_and_disjoint_from_training(tmp_path):
    rows = _rows(3000, dup_every=3)
    index = _index(tmp_path, rows)
    config = MiningConfig(holdout_fraction=0.2, holdout_max=10_000, max_hard_per_slice=50, max_rollback_per_slice=10)
    ts = np.array([r[4] for r in rows])
    selection = select(index, len(rows), (ts.min(), ts.max()), config)
    assert (ts >= selection.cutoff).sum() >= 600 > (ts > selection.cutoff).sum()
    held = selection.holdout
    assert (held["ts"] >= selection.cutoff).all()
    late_keys = {r[8] for r in rows if r[4] >= selection.cutoff}
    for category in selection.candidates.values():
        for slice_id, cands in category.items():
            assert (cands["ts"] < selection.cutoff).all()
            assert not late_keys & set(cands["key"].tolist())  # same prompt as a hold-out one: excluded
            assert len(set(cands["key"].tolist())) == len(cands)  # distinct prompts


def test_hard_candidates_are_the_lowest_acceptance_per_slice_within_caps(tmp_path):
    rows = _rows(2000)
    index = _index(tmp_path, rows)
    config = MiningConfig(holdout_fraction=0.0, hard_quantile=0.1, max_hard_per_slice=30, max_rollback_per_slice=5)
    selection = select(index, len(rows), (1000.0, 3000.0), config)
    for slice_id in range(3):
        pool = sorted(r[6] for r in rows if r[5] == slice_id)
        quota = selection.quotas[slice_id]["hard"]
        assert quota == min(30, math.ceil(0.1 * len(pool)))
        hard = selection.candidates["hard"][slice_id]
        assert len(hard) == OVERSAMPLE * quota
        assert np.allclose(np.sort(hard["rate"]), np.array(pool[:len(hard)], dtype=np.float32))
        rollback = selection.candidates["rollback"][slice_id]
        assert len(rollback) <= OVERSAMPLE * 5 and (rollback["depth"] >= config.min_rollback_depth).all()
        # The hard list's head (its quota) is reserved; its over-sampled tail may reappear as rollback.
        assert not set(rollback["row"].tolist()) & set(hard["row"][:quota].tolist())


def test_threshold_mode_only_takes_rates_at_or_below_it(tmp_path):
    rows = _rows(600)
    index = _index(tmp_path, rows)
    config = MiningConfig(holdout_fraction=0.0, hard_threshold=0.05, max_hard_per_slice=1000)
    selection = select(index, len(rows), (1000.0, 2000.0), config)
    for slice_id, hard in selection.candidates["hard"].items():
        assert (hard["rate"] <= 0.05).all()
        assert len(hard) == sum(1 for r in rows if r[5] == slice_id and np.float32(r[6]) <= np.float32(0.05))


def test_index_round_trips_in_chunks(tmp_path):
    rows = _rows(70_000, slices=2)
    index = _index(tmp_path, rows)
    chunks = list(index.chunks())
    assert len(chunks) == 2 and sum(len(c) for c in chunks) == 70_000 and chunks[0].dtype == ROW
    assert chunks[1][-1]["row"] == 69_999


def test_focus_samples_come_only_from_traffic_after_focus_after(tmp_path):
    """The flywheel's round mines the traffic since its last round: hard, rollback and uniform candidates
    all come after `focus_after`, their quotas count only that traffic, while replay still reads earlier
    requests and keeps a slice that had no new traffic."""
    rows = _rows(1200)  # ts 1000..1599, slices 0..2
    rows += [(1200 + i, 0, i + 1, i * 100, 900.0 + i, 3, 0.5, 3, 5000 + i, i) for i in range(40)]  # slice 3: old only
    index = _index(tmp_path, rows)
    after = 1400.0
    config = MiningConfig(holdout_fraction=0.0, hard_quantile=0.25, max_hard_per_slice=1000,
                          max_rollback_per_slice=20, focus_after=str(after))
    selection = select(index, len(rows), (900.0, 1600.0), config)
    for category in ("hard", "rollback", "uniform"):
        for cands in selection.candidates[category].values():
            assert (cands["ts"] > after).all(), category
    for slice_id in range(3):
        focus = sum(1 for r in rows if r[5] == slice_id and r[4] > after)
        assert selection.train_counts[slice_id] == focus
        assert selection.quotas[slice_id]["hard"] == math.ceil(0.25 * focus)
    assert 3 not in selection.train_counts and selection.quotas[3]["hard"] == 0
    replay = selection.candidates["replay"]
    assert len(replay[3]) > 0 and (replay[3]["ts"] < after).all()  # the old slice is still replayed
    everything = select(index, len(rows), (900.0, 1600.0), MiningConfig(
        holdout_fraction=0.0, hard_quantile=0.25, max_hard_per_slice=1000, max_rollback_per_slice=20))
    assert (everything.candidates["hard"][0]["ts"] <= after).any()  # without a focus, earlier traffic too
    # The hold-out is the latest fraction of the focus traffic, not of all the logs.
    held = select(index, len(rows), (900.0, 1600.0), MiningConfig(holdout_fraction=0.5, focus_after=str(after)))
    focus_ts = np.sort([r[4] for r in rows if r[4] > after])
    assert held.cutoff == focus_ts[::-1][math.ceil(0.5 * len(focus_ts)) - 1]
    assert sum(held.train_counts.values()) == int((focus_ts < held.cutoff).sum()) > 0


def test_focus_after_must_be_a_time():
    with pytest.raises(ValueError, match="focus_after"):
        MiningConfig(focus_after="last tuesday")
