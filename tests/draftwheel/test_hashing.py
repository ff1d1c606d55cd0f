"""Content digests: equal data gives equal digests, any byte or name change gives a different one."""

from __future__ import annotations

import hashlib

import pytest

from draftwheel.hashing import file_sha256, tree_sha256, weights_sha256


def test_file_sha256_matches_hashlib(tmp_path):
    data = b"x" * (3 << 20)  # several 1 MiB blocks
    (tmp_path / "f").write_bytes(data)
    assert file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_tree_digest_ignores_the_datasets_fingerprint_but_not_data(tmp_path):
    for name, fingerprint in (("a", b"fp-1"), ("b", b"fp-2")):
        (tmp_path / name / "distill").mkdir(parents=True)
        (tmp_path / name / "distill" / "data.arrow").write_bytes(b"rows")
        (tmp_path / name / "distill" / "state.json").write_bytes(fingerprint)
    assert tree_sha256([tmp_path / "a"]) == tree_sha256([tmp_path / "b"])
    (tmp_path / "b" / "distill" / "data.arrow").write_bytes(b"rowz")
    assert tree_sha256([tmp_path / "a"]) != tree_sha256([tmp_path / "b"])
    (tmp_path / "b" / "distill" / "data.arrow").write_bytes(b"rows")
    (tmp_path / "b" / "distill" / "data.arrow").rename(tmp_path / "b" / "distill" / "other.arrow")
    assert tree_sha256([tmp_path / "a"]) != tree_sha256([tmp_path / "b"])  # names count too


def test_weights_digest_covers_every_shard_and_needs_one(tmp_path):
    (tmp_path / "model-1.safetensors").write_bytes(b"one")
    first = weights_sha256(tmp_path)
    (tmp_path / "model-2.safetensors").write_bytes(b"two")
    assert weights_sha256(tmp_path) != first
    (tmp_path / "config.json").write_bytes(b"{}")  # not weights: no effect
    second = weights_sha256(tmp_path)
    (tmp_path / "config.json").write_bytes(b'{"a": 1}')
    assert weights_sha256(tmp_path) == second
    with pytest.raises(FileNotFoundError, match="safetensors"):
        weights_sha256(tmp_path / "missing")
