"""Registry functions of draftwheel.tracking against a real sqlite MLflow registry in a temp state dir.

One registry is shared by the module (MLflow's sqlite initialisation takes seconds); tests that need
a clean alias history use their own registered-model name.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pytest

from draftwheel import tracking
from draftwheel.registry import promote, rollback
from draftwheel.registry_names import TARGET_SHA_TAG
from draftwheel.tracking import ArtifactError, RegistryError

TRAINED_FOR = {TARGET_SHA_TAG: "ab" * 32}  # what promote and rollback ask of every version


@pytest.fixture(scope="module")
def registry(module_home):
    """This module's own state dir, hence its own sqlite registry."""
    return module_home


def fake_model_dir(root: Path, weights: bytes = b"weights-1", extra: dict[str, bytes] | None = None) -> Path:
    """A model dir with the file kinds a HF save has; the registry does not parse weights."""
    root.mkdir(parents=True, exist_ok=True)
    files = {"model.safetensors": weights, "config.json": b'{"model_type": "llama"}',
             "tokenizer.json": b"{}", "chat_template.jinja": b"{{ x }}", **(extra or {})}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def stored_dir(version: str, name: str = tracking.DRAFT_MODEL) -> Path:
    """Where the artifact store keeps a version's files serving loads (the local file store of the default
    setup): inside the version's MLflow model."""
    row = next(r for r in tracking.list_versions(name) if r["version"] == version)
    return Path(urlparse(tracking.files_uri(row["source"], row["tags"])).path)


def test_register_tags_and_files(registry, tmp_path):
    model = fake_model_dir(tmp_path / "m", extra={"pytorch_model.bin": b"pickle!", "notes.md": b"x"})
    version = tracking.register_draft(model, {"target_sha256": "abc", "training_config": {"lr": 0.1}})
    tags = tracking.get_version_tags(version)
    assert tags["target_sha256"] == "abc"
    assert json.loads(tags["training_config"]) == {"lr": 0.1}
    files = json.loads(tags[tracking.FILES_TAG])
    # The pickle and the unknown file stay behind; only safetensors + json/text files are stored.
    assert sorted(files) == ["chat_template.jinja", "config.json", "model.safetensors", "tokenizer.json"]
    assert files["model.safetensors"] == tracking.file_sha256(model / "model.safetensors")
    assert sorted(p.name for p in stored_dir(version).iterdir()) == sorted(files)


def test_register_refuses_pickle_only_dir(registry, tmp_path):
    model = tmp_path / "pickled"
    model.mkdir()
    (model / "pytorch_model.bin").write_bytes(b"pickle!")
    (model / "config.json").write_text("{}")
    with pytest.raises(ArtifactError, match="no .safetensors"):
        tracking.register_draft(model, {})


def test_promote_and_rollback_move_aliases(registry, tmp_path):
    name = "alias-test"
    v1, v2, v3 = (tracking.register_draft(fake_model_dir(tmp_path / str(i), f"w{i}".encode()), TRAINED_FOR, name=name)
                  for i in range(3))
    with pytest.raises(RegistryError, match="no 'previous'"):
        rollback(name)
    assert promote(v1, name) == {"champion": v1}
    assert promote(v2, name) == {"champion": v2, "previous": v1}
    tracking.set_alias(v3, "challenger", name)
    with pytest.raises(ValueError, match="champoin"):
        tracking.set_alias(v3, "champoin", name)
    assert tracking.get_alias_version("challenger", name) == v3
    assert rollback(name) == {"champion": v1, "previous": v2, "challenger": v3}
    # A second rollback undoes the first.
    assert rollback(name) == {"champion": v2, "previous": v1, "challenger": v3}
    # Promoting the champion again changes nothing (previous must not become the champion itself).
    assert promote(v2, name)["previous"] == v1
    rows = {r["version"]: r["aliases"] for r in tracking.list_versions(name)}
    assert rows == {v1: ["previous"], v2: ["champion"], v3: ["challenger"]}


def test_promote_unknown_version_leaves_aliases(registry, tmp_path):
    name = "unknown-test"
    v1 = tracking.register_draft(fake_model_dir(tmp_path / "m"), TRAINED_FOR, name=name)
    promote(v1, name)
    with pytest.raises(RegistryError, match="version=99"):
        promote("99", name)
    assert tracking.aliases(name) == {"champion": v1}
    # Several aliases move all or nothing: one unknown version and none of them moves.
    v2 = tracking.register_draft(fake_model_dir(tmp_path / "m2", b"w2"), {}, name=name)
    with pytest.raises(RegistryError, match="version=99"):
        tracking.move_aliases({"challenger": v2, "previous": "99"}, name)
    assert tracking.aliases(name) == {"champion": v1}
    assert tracking.move_aliases({"challenger": v2, "champion": None}, name) == {"challenger": v2}


def test_resolve_by_alias_and_version(registry, tmp_path):
    name = "resolve-test"
    model = fake_model_dir(tmp_path / "m", b"resolve-weights")
    version = tracking.register_draft(model, {"target_sha256": "t"}, name=name)
    tracking.set_alias(version, "champion", name)
    local, got_version, tags = tracking.resolve_model_uri(f"models:/{name}@champion")
    assert got_version == version and tags["target_sha256"] == "t"
    assert local.is_relative_to(registry)  # the cache lives in the state dir
    assert (local / "model.safetensors").read_bytes() == b"resolve-weights"
    again, _, _ = tracking.resolve_model_uri(f"models:/{name}/{version}")
    assert again == local
    # A damaged cache is detected and fetched again from the store.
    (local / "model.safetensors").write_bytes(b"bit rot")
    repaired, _, _ = tracking.resolve_model_uri(f"models:/{name}/{version}")
    assert (repaired / "model.safetensors").read_bytes() == b"resolve-weights"


def test_resolve_refuses_corrupt_missing_and_pickle_artifacts(registry, tmp_path):
    name = "damage-test"
    versions = [tracking.register_draft(fake_model_dir(tmp_path / str(i), f"d{i}".encode()), {}, name=name)
                for i in range(3)]
    corrupt, missing, pickled = (stored_dir(v, name) for v in versions)
    (corrupt / "model.safetensors").write_bytes(b"flipped bits")
    (missing / "model.safetensors").unlink()
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"pickle!")
    cache = tmp_path / "cache"
    with pytest.raises(ArtifactError, match="corrupt.*model.safetensors"):
        tracking.resolve_model_uri(f"models:/{name}/{versions[0]}", cache_dir=cache)
    with pytest.raises(ArtifactError, match="missing.*model.safetensors"):
        tracking.resolve_model_uri(f"models:/{name}/{versions[1]}", cache_dir=cache)
    with pytest.raises(ArtifactError, match="pytorch_model.bin"):
        tracking.resolve_model_uri(f"models:/{name}/{versions[2]}", cache_dir=cache)
    # Nothing half-verified is left in the cache for a later load to pick up.
    assert not any((cache / name).iterdir())


def test_resolve_refuses_version_without_file_hashes(registry, tmp_path):
    with pytest.raises(ArtifactError, match="files_sha256"):
        tracking.verify_model_dir(fake_model_dir(tmp_path / "m"), {}, "v")


@pytest.mark.parametrize("uri", ["runs:/abc/model", "models:/name", "models:/name/latest", "models:/@x"])
def test_resolve_rejects_malformed_uris(registry, uri):
    with pytest.raises(RegistryError, match="models:/NAME"):
        tracking.resolve_model_uri(uri)


def test_resolve_unset_alias_and_missing_model(registry, tmp_path):
    name = "unset-test"
    tracking.register_draft(fake_model_dir(tmp_path / "m"), {}, name=name)
    with pytest.raises(RegistryError, match="alias 'champion' is not set"):
        tracking.resolve_model_uri(f"models:/{name}@champion")
    with pytest.raises(RegistryError, match="no-such-model"):
        tracking.get_alias_version("champion", "no-such-model")


def test_unreachable_registry_raises_registry_error(registry, monkeypatch):
    # Nothing listens on port 9; no retries so the test stays fast.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with pytest.raises(RegistryError, match="127.0.0.1:9"):
        tracking.resolve_model_uri("models:/draftwheel-draft@champion", tracking_uri="http://127.0.0.1:9")
    with pytest.raises(RegistryError):
        tracking.move_aliases({"champion": "1"}, tracking_uri="http://127.0.0.1:9")


def test_a_metric_named_after_a_clients_slice_never_fails_the_run(registry):
    """A request's slice is any string a client sends, and metrics carry slice names: MLflow refuses
    some characters and path-like names, so the tracker maps those to `_` and logs the rest as they are."""
    from mlflow.tracking import MlflowClient

    assert tracking.metric_key("steps.chat.champion.suffix") == "steps.chat.champion.suffix"
    assert tracking.metric_key("corpus.my slice/v2:a-b") == "corpus.my slice/v2:a-b"  # all allowed: unchanged
    assert tracking.metric_key("corpus.c++|sql") == "corpus.c___sql"
    assert tracking.metric_key("steps./../x//y/") == "steps./_/x/_/y/_"
    tracker = tracking.get_tracker(True)
    with tracker.run("odd-slices") as run_id:
        tracker.log_metrics({"corpus.c++|sql": 3, "steps./../x": 0.5, "plain": 1})
    logged = MlflowClient().get_run(run_id).data.metrics
    assert logged == {"corpus.c___sql": 3.0, "steps./_/x": 0.5, "plain": 1.0}
