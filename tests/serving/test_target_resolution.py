"""Which target a command serves and trains for when given none (`draftwheel.serving.loading.resolve_target`):
the one the draft in use was trained for, as its registry version's tags record it; the reference target
only with no such version. Tags are written by `target_tags`, read back by `recorded_target`."""

from __future__ import annotations

import shutil

import pytest

from draftwheel import registry
from draftwheel.registry_names import TARGET_DIR_TAG, TARGET_HUB_TAG, TARGET_SHA_TAG, version_uri
from draftwheel.serving.engine.models import weights_sha256
from draftwheel.serving.engine.reference import HUB_ID, default_target_dir
from draftwheel.serving.loading import TargetGoneError, recorded_target, resolve_target, target_tags
from draftwheel.serving.testing import tiny_pair
from tests.conftest import make_champion


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def test_with_nothing_registered_the_reference_target_and_no_registry_is_created(state):
    assert resolve_target(convert_reference=False) == str(default_target_dir())
    assert resolve_target("my/target") == "my/target"  # a given target always wins
    assert not (state / "mlflow.db").exists()  # asking did not open (create) a registry


def test_tags_record_the_dir_relative_to_the_state_dir_and_the_hub_id(state, tmp_path):
    inside = state / "models" / "mine"
    inside.mkdir(parents=True)
    assert target_tags(inside, "s" * 64, inside) == {TARGET_SHA_TAG: "s" * 64, TARGET_DIR_TAG: "models/mine"}
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert target_tags(outside, "s" * 64, outside)[TARGET_DIR_TAG] == str(outside)
    snapshot = tmp_path / "hub" / "models--my-org--my-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert target_tags("my-org/my-model", "s" * 64, snapshot)[TARGET_HUB_TAG] == "my-org/my-model"
    assert target_tags(snapshot, "s" * 64, snapshot)[TARGET_HUB_TAG] == "my-org/my-model"  # from the cache path
    reference = default_target_dir()
    reference.mkdir(parents=True)
    assert target_tags(reference, "s" * 64, reference) == {
        TARGET_SHA_TAG: "s" * 64, TARGET_DIR_TAG: "models/smollm2-135m-instruct", TARGET_HUB_TAG: HUB_ID}


def test_recorded_target_follows_a_moved_state_dir_falls_back_to_the_hub_and_says_when_gone(state, tmp_path,
                                                                                          monkeypatch):
    (state / "models" / "mine").mkdir(parents=True)
    tags = {TARGET_SHA_TAG: "a" * 64, TARGET_DIR_TAG: "models/mine"}
    assert recorded_target(tags, "v1") == str(state / "models" / "mine")
    moved = tmp_path / "moved"
    shutil.move(state, moved)
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(moved))
    assert recorded_target(tags, "v1") == str(moved / "models" / "mine")  # the copy's own, not the original's
    assert recorded_target({**tags, TARGET_DIR_TAG: "/gone/dir", TARGET_HUB_TAG: "org/name"}, "v1") == "org/name"
    with pytest.raises(TargetGoneError, match=r"draftwheel-draft version 1 \(champion\) was trained for the "
                                              r"target at /gone/dir \(weights aaaaaaaaaaaa\), which is gone"):
        recorded_target({**tags, TARGET_DIR_TAG: "/gone/dir"}, "draftwheel-draft version 1 (champion)")
    assert recorded_target({TARGET_SHA_TAG: "a" * 64}, "v1") is None  # registered before places were recorded


def test_the_draft_in_use_names_the_target(state, tmp_path):
    """The champion's recorded target by default; a `models:/NAME/VERSION` draft's own; a champion that
    records no place (registered before places were recorded) leaves the reference target."""
    first_target, draft = tiny_pair(tmp_path / "a")
    second_target = tiny_pair(tmp_path / "b", seed=3)[0]
    tagged = [registry.register_version(draft, "lm", target_tags(t, weights_sha256(t), t))
              for t in (first_target, second_target)]
    make_champion(tagged[0])
    assert resolve_target() == str(first_target)
    assert resolve_target(None, version_uri(tagged[1])) == str(second_target)
    assert resolve_target(None, str(draft)) == str(first_target)  # a local draft: the champion's target
    bare = registry.register_version(draft, "lm", {TARGET_SHA_TAG: weights_sha256(first_target)})
    make_champion(bare)
    assert resolve_target(convert_reference=False) == str(default_target_dir())
    make_champion(tagged[1])
    shutil.rmtree(second_target)
    with pytest.raises(TargetGoneError, match=f"{second_target}.*gone"):
        resolve_target()
