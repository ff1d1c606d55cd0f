"""`draftwheel.serving.engine.reference.hub_id`: the Hugging Face id a target spec names, or "" where none is known.

The id is what an exported draft records as its verifier (vLLM loads the target by it on another
machine), so a local path must never come out as one. The GGUF conversion itself is in test_models.py.
"""

from __future__ import annotations

import pytest

from draftwheel.serving.engine.reference import HUB_ID, REFERENCE_DIR_NAME, hub_id, is_hub_id


def test_hub_ids_are_org_slash_name_and_never_paths():
    assert is_hub_id(HUB_ID) and is_hub_id("org/name.v2_b-1")
    for path in ("/abs/dir", "./org/name", "../org/name", "~/org/name", "org/name/sub", "name", "", "org/..x"):
        assert not is_hub_id(path), path


def test_hub_id_where_known(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reference = tmp_path / "state" / "models" / REFERENCE_DIR_NAME
    assert hub_id(reference) == HUB_ID  # the converted reference, wherever the state dir is
    assert hub_id("org/name") == "org/name"  # a hub id (no such local dir)
    snapshot = tmp_path / "hub" / "models--org--my-model" / "snapshots" / "0a1b2c"
    assert hub_id(snapshot) == "org/my-model"  # a hub cache snapshot
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    for unknown in ("org/name", local, tmp_path / "my-target", "models:/draftwheel-draft@champion", ""):
        assert hub_id(unknown) == "", unknown  # a local dir (even one spelled org/name), the registry, nothing


@pytest.mark.parametrize("spec", ["models:/x@champion", "relative-dir"])
def test_hub_id_of_other_specs_is_unknown(spec):
    assert hub_id(spec) == ""
