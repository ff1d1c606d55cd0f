"""The replay share: every served slice keeps earlier traffic in the mix, evenly, whatever its traffic.

The logs hold a large new slice (code, 300 requests, the latest, so the hold-out is all code), an
older chat slice (40) and a small prose slice (16). Without replay, chat and prose would enter training
only through their own hard samples; with it each gets the same replay quota as code.
"""

from __future__ import annotations

from collections import Counter

import pytest
from datasets import load_from_disk

from draftwheel.mining.pipeline import mine
from tests.mining.conftest import fast_config, make_record, write_lines


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    sizes = {"prose": (16, 1000.0), "chat": (40, 2000.0), "code": (300, 3000.0)}
    records, index = [], 0
    for name, (count, start) in sizes.items():
        for i in range(count):
            records.append(make_record(index, ts=start + i, slice=name))
            index += 1
    return write_lines(root / "logs" / "a.jsonl", records).parent


def _mine(logs, tmp_path, **overrides):
    manifest = mine(logs, tmp_path / "out", fast_config(max_rollback_per_slice=2, **overrides))
    return manifest, load_from_disk(str(tmp_path / "out" / "distill"))


def test_every_served_slice_gets_the_same_replay_quota(logs, tmp_path):
    manifest, distill = _mine(logs, tmp_path)
    replay = manifest["replay"]
    assert set(replay["slices"]) == {"chat", "code", "prose"}
    quotas = {entry["quota"] for entry in replay["slices"].values()}
    assert len(quotas) == 1 and quotas.pop() >= 8  # even split, at least replay_min_per_slice
    assert replay["slices"]["chat"]["kept"] == replay["slices"]["chat"]["quota"]  # chat has enough left
    focus = sum(manifest["slices"][s]["selected"].get(c, 0) for s in replay["slices"]
                for c in ("hard", "rollback", "uniform"))
    kept = sum(entry["kept"] for entry in replay["slices"].values())
    assert kept <= 0.25 / 0.75 * focus + 3 * 8 + 3  # the share, or the per-slice minimum
    per_slice = Counter(distill["slice"])
    for name, entry in manifest["slices"].items():
        assert per_slice[name] == sum(entry["selected"].values())
    assert replay["missing"] == []


def test_a_slice_short_of_replay_is_up_weighted_up_to_the_cap(logs, tmp_path):
    manifest, distill = _mine(logs, tmp_path)
    prose = manifest["replay"]["slices"]["prose"]
    assert prose["kept"] < prose["quota"]  # 16 requests: its hard/rollback/uniform samples took most
    if prose["kept"]:
        assert prose["weight"] == pytest.approx(min(4.0, prose["quota"] / prose["kept"]))
        weights = {w for s, w in zip(distill["slice"], distill["weight"]) if s == "prose"}
        assert any(w == pytest.approx(prose["weight"]) for w in weights)
    assert manifest["replay"]["slices"]["chat"]["weight"] == 1.0


def test_boost_multiplies_one_slice_and_missing_slices_are_named(logs, tmp_path):
    base, _ = _mine(logs, tmp_path / "a")
    boosted, _ = _mine(logs, tmp_path / "b", replay_boost={"chat": 2.0}, replay_slices=["chat", "legal"])
    chat, before = boosted["replay"]["slices"]["chat"], base["replay"]["slices"]["chat"]
    assert chat["quota"] >= 2 * before["quota"] - 1 and chat["kept"] > before["kept"]
    assert boosted["replay"]["slices"]["code"]["quota"] == base["replay"]["slices"]["code"]["quota"]
    assert boosted["replay"]["missing"] == ["legal"]  # served (the canary set says so) but never logged


def test_replay_share_zero_turns_replay_off(logs, tmp_path):
    manifest, _ = _mine(logs, tmp_path, replay_share=0.0)
    assert all(entry["kept"] == entry["quota"] == 0 for entry in manifest["replay"]["slices"].values())


@pytest.mark.parametrize("override, field", [({"replay_share": 1.0}, "replay_share"),
                                             ({"replay_boost": {"chat": -1}}, "replay_boost.chat"),
                                             ({"replay_max_upweight": 0.5}, "replay_max_upweight")])
def test_bad_replay_settings_name_the_field(override, field):
    with pytest.raises(ValueError, match=field):
        fast_config(**override)
