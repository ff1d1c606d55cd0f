"""A size budget for the target-side caches under the feature cache root (feature rows, continuations,
canary answers), kept least recently used first.

Every round adds the features of its new sequences (a few MB per hundred tokens of a sequence at the
reference target's width), and nothing in a long-running flywheel would ever delete them. A read
refreshes a file's modification time (`touch`), so after a training run's preparation the files it
used are the newest; `prune` then deletes the oldest until the cache fits its budget, and never a file
used since `keep_since` (the run's own set stays whole even when it alone is over the budget).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


def touch(path: Path) -> None:
    """Mark a cache file as used now (its modification time): the pruning order."""
    os.utime(path)


@dataclass
class Pruned:
    files: int        # cache files deleted
    freed: int        # their bytes
    kept_bytes: int   # what the cache holds after pruning


def prune(root: Path, max_bytes: int, keep_since: float | None = None) -> Pruned:
    """Delete the least recently used files under `root` until it holds at most `max_bytes`, sparing every
    file modified at or after `keep_since` (a `time.time()`; the file system's clock is coarser, so take
    it a second before the run began). Leftover `.tmp` files of an interrupted write go first.
    `max_bytes` <= 0 means no budget."""
    if not root.is_dir():
        return Pruned(0, 0, 0)
    entries = []
    for path in root.rglob("*"):
        if path.is_file():
            stat = path.stat()
            entries.append((path.suffix != ".tmp", stat.st_mtime, stat.st_size, path))
    total = sum(size for _, _, size, _ in entries)
    files = freed = 0
    if max_bytes <= 0:
        return Pruned(0, 0, total)
    spare_from = keep_since if keep_since is not None else time.time()
    for _, mtime, size, path in sorted(entries, key=lambda e: e[:2]):
        if total <= max_bytes:
            break
        if mtime >= spare_from:
            continue  # used by the current run (or being written by it)
        path.unlink(missing_ok=True)
        total, files, freed = total - size, files + 1, freed + size
    return Pruned(files, freed, total)
