"""Content digests used as identities across the project: files, directory trees and model weights.

One implementation so that a digest computed by serving (the draft id in a log record), by the registry
(a version tag) and by mining (a manifest entry) always agree. Streams files in 1 MiB blocks.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

# `datasets` writes a random fingerprint into state.json on every save: identical data, different bytes.
VOLATILE_FILES = frozenset({"state.json"})


def _update_from_file(digest: "hashlib._Hash", path: Path) -> None:
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    _update_from_file(digest, Path(path))
    return digest.hexdigest()


def tree_sha256(paths: Iterable[str | Path], root: str | Path | None = None) -> str:
    """sha256 over files and directories: each file's path (relative to `root`, or to its directory
    argument) and bytes, in sorted order; `VOLATILE_FILES` are skipped so equal data gives equal digests."""
    digest = hashlib.sha256()
    for top in map(Path, paths):
        base = Path(root) if root is not None else (top if top.is_dir() else top.parent)
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for file in files:
            if file.name in VOLATILE_FILES:
                continue
            digest.update(f"{file.relative_to(base)}\0".encode())
            _update_from_file(digest, file)
    return digest.hexdigest()


def weights_sha256(model_dir: str | Path) -> str:
    """One digest of a model dir's safetensors shards: sha256 of the lines "name:sha256(file)", sorted.

    The registry's `weights_sha256` version tag and the `sha256` of a record's model ids use this, so a
    registered version and the dir it came from report the same id.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    joined = "".join(f"{path.name}:{file_sha256(path)}\n" for path in files)
    return hashlib.sha256(joined.encode()).hexdigest()
