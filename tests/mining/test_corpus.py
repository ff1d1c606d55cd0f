"""The retained corpus: bounded by slice and age, de-duplicated by prompt, mixed into a round's training set."""

from __future__ import annotations

import pytest
from datasets import Dataset, load_from_disk

from draftwheel.mining.corpus import ADDED, CorpusPolicy, mined_until, mix_into, retain, sizes
from draftwheel.mining.outputs import DISTILL


def distill(path, prompts, slice_name="code"):
    rows = [{"prompt": p, "completion": "x", "prompt_token_ids": [1, 2], "completion_token_ids": [3],
             "slice": slice_name, "weight": 1.0, "served_residual": [1.0]} for p in prompts]
    Dataset.from_list(rows, features=DISTILL).save_to_disk(str(path))
    return path


def test_rounds_accumulate_and_a_prompt_seen_again_keeps_its_newest_row(tmp_path):
    policy = CorpusPolicy()
    retain(tmp_path / "corpus", distill(tmp_path / "r1", ["a", "b"]), policy, now=1000.0)
    assert retain(tmp_path / "corpus", distill(tmp_path / "r2", ["B", "c"], "sql"), policy, now=2000.0) \
        == {"code": 1, "sql": 2}  # "B" is "b" again (case ignored), now as sql
    rows = load_from_disk(str(tmp_path / "corpus")).to_list()
    assert sorted((r["prompt"], r[ADDED]) for r in rows) == [("B", 2000.0), ("a", 1000.0), ("c", 2000.0)]
    assert sizes(tmp_path / "corpus") == {"code": 1, "sql": 2} and sizes(tmp_path / "none") == {}


def test_bounds_per_slice_and_age(tmp_path):
    policy = CorpusPolicy(max_per_slice=2, max_age_days=1.0)
    retain(tmp_path / "corpus", distill(tmp_path / "r1", ["old"]), policy, now=0.0)
    retain(tmp_path / "corpus", distill(tmp_path / "r2", ["p", "q", "r"]), policy, now=2 * 86400.0)
    rows = load_from_disk(str(tmp_path / "corpus")).to_list()
    assert len(rows) == 2 and "old" not in {r["prompt"] for r in rows}  # two days old: past the limit


def test_a_round_trains_on_earlier_rounds_rows_too(tmp_path):
    policy = CorpusPolicy(ratio=1.0)
    retain(tmp_path / "corpus", distill(tmp_path / "r1", ["a", "b", "c"]), policy, now=1.0)
    round2 = distill(tmp_path / "r2", ["c", "d"])
    retain(tmp_path / "corpus", round2, policy, now=2.0)
    assert mix_into(round2, tmp_path / "corpus", policy, seed=0) == 2  # ratio 1: as many as mined
    mixed = load_from_disk(str(round2))
    assert sorted(mixed["prompt"]) in (["a", "b", "c", "d"],) and mixed.features == DISTILL
    assert mix_into(distill(tmp_path / "r3", ["e"]), tmp_path / "corpus", CorpusPolicy(ratio=0.0)) == 0


def test_bad_bounds_name_the_field():
    with pytest.raises(ValueError, match="corpus_max_per_slice"):
        CorpusPolicy(max_per_slice=0)
    with pytest.raises(ValueError, match="corpus_ratio"):
        CorpusPolicy(ratio=-1.0)


def test_the_corpus_remembers_the_newest_request_mined_and_never_moves_it_back(tmp_path):
    policy = CorpusPolicy()
    assert mined_until(tmp_path / "corpus") is None  # no round yet: the next one mines all the logs
    retain(tmp_path / "corpus", distill(tmp_path / "r1", ["a"]), policy, now=1.0, newest_ts=500.0)
    assert mined_until(tmp_path / "corpus") == 500.0
    retain(tmp_path / "corpus", distill(tmp_path / "r2", ["b"]), policy, now=2.0, newest_ts=400.0)
    assert mined_until(tmp_path / "corpus") == 500.0  # an older window (a re-mine) keeps the mark
    retain(tmp_path / "corpus", distill(tmp_path / "r3", ["c"]), policy, now=3.0, newest_ts=800.5)
    assert mined_until(tmp_path / "corpus") == 800.5
    assert sizes(tmp_path / "corpus") == {"code": 3}  # the mark does not disturb the dataset
