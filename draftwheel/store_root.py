"""Re-rooting a moved or copied state dir's own MLflow store, so that a copy reads and writes its own files.

MLflow's sqlite store keeps absolute `file://` URIs: the `draftwheel` experiment's artifact location (the
state dir's `mlartifacts/`, `home.artifacts_uri()`) and, under it, every run's artifact URI and every
model version's source. Copied or moved as they are, those rows still name the original's artifact store:
a copy would read the original's weights and write (or delete) into it. The experiment's artifact
location is the record of the state dir the store was last opened in. `reroot(db, experiment, root_uri)`
compares it with the current root and, when they differ, rewrites every URI under the recorded root to the
same place under `root_uri`, in one sqlite transaction: a reader never sees half a store re-rooted, and two
processes opening a copy at once re-root it once.

Only the columns in `URI_COLUMNS` change, only values under the recorded root, only in the db given:
`draftwheel.tracking` (the sole caller) passes the state dir's own sqlite file, never a remote
`MLFLOW_TRACKING_URI` nor a sqlite file outside the state dir. It imports no MLflow and moves no files.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from draftwheel.home import ARTIFACTS_DIR

URI_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"), ("model_versions", "source"),
               ("model_versions", "storage_location"), ("logged_models", "artifact_location"))
"""Where MLflow's sqlite schema keeps artifact URIs (a table or column an MLflow version lacks is skipped)."""


@dataclass(frozen=True)
class Rerooted:
    """What `reroot` changed: URIs under `old` now lie under `new`, in `rows` rows."""

    old: tuple[str, ...]
    new: str
    rows: int


def reroot(db_path: Path, experiment: str, root_uri: str, timeout_s: float = 60.0) -> Rerooted | None:
    """Move every artifact URI under the artifact root that `experiment` records to `root_uri`; None when
    the record is `root_uri` already (or the db has no such experiment). Raises `sqlite3.Error` (the db
    is unreadable, read-only, or stays locked for `timeout_s`) with nothing changed."""
    if not db_path.is_file():
        return None
    with contextlib.closing(sqlite3.connect(db_path, timeout=timeout_s, isolation_level=None)) as db:
        if not _recorded_roots(db, experiment, root_uri):  # the usual case: one read, no write lock
            return None
        db.execute("BEGIN IMMEDIATE")
        try:
            old = _recorded_roots(db, experiment, root_uri)  # again under the lock: another process may be done
            rows = sum(_rewrite(db, table, column, root, root_uri) for root in old for table, column in _present(db))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return Rerooted(old, root_uri, rows) if old else None


def _recorded_roots(db: sqlite3.Connection, experiment: str, root_uri: str) -> tuple[str, ...]:
    """The artifact roots other than `root_uri` that `experiment` records: file URIs of a state dir's
    `mlartifacts`, as `home.artifacts_uri()` wrote them (an artifact location set otherwise is left alone)."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'experiments'").fetchone() is None:
        return ()  # a store MLflow has not initialised yet
    locations = {row[0] for row in db.execute("SELECT artifact_location FROM experiments WHERE name = ?",
                                              (experiment,))}
    return tuple(sorted(loc for loc in locations if loc and loc != root_uri and loc.startswith("file:")
                        and loc.endswith(f"/{ARTIFACTS_DIR}")))


def _present(db: sqlite3.Connection) -> Iterator[tuple[str, str]]:
    for table, column in URI_COLUMNS:
        if column in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
            yield table, column


def _rewrite(db: sqlite3.Connection, table: str, column: str, old: str, new: str) -> int:
    """`old` itself and `old/...` become `new` and `new/...`; `old2/...` and everything else stay."""
    n = len(old)
    return db.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                      f"WHERE {column} = ? OR substr({column}, 1, ?) = ?", (new, n + 1, old, n + 1, f"{old}/")).rowcount
