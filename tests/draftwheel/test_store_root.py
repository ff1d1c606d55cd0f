"""`draftwheel.store_root.reroot` on a hand-made store with MLflow's URI columns (no MLflow: milliseconds).

MLflow's real store, copied and served from, is tests/flows/test_state_dir_copy.py; here are the edges:
what is rewritten and what is not, a second open, and the failure paths (a locked or corrupt db).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from draftwheel import store_root, tracking

OLD = Path("/data/old state/mlartifacts").as_uri()  # a space: URIs are compared as MLflow stored them


def make_store(path: Path, experiment_root: str = OLD) -> Path:
    """A sqlite file with the tables and columns of MLflow's schema that hold artifact URIs (no
    `logged_models`: an older schema), recording `experiment_root` for the draftwheel experiment."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE experiments (experiment_id INTEGER, name TEXT, artifact_location TEXT)")
        db.execute("CREATE TABLE runs (run_uuid TEXT, artifact_uri TEXT)")
        db.execute("CREATE TABLE model_versions (version INTEGER, source TEXT, storage_location TEXT)")
        db.executemany("INSERT INTO experiments VALUES (?, ?, ?)",
                       [(0, "Default", "/work/mlruns/0"), (1, tracking.EXPERIMENT, experiment_root)])
        db.executemany("INSERT INTO runs VALUES (?, ?)", [("a", f"{OLD}/a/artifacts"), ("b", f"{OLD}2/b/artifacts"),
                                                          ("c", "file:///elsewhere/mlartifacts/c/artifacts")])
        db.execute("INSERT INTO model_versions VALUES (1, ?, ?)", (f"{OLD}/a/artifacts/model",) * 2)
    return path


def dump(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(path) as db:
        return {table: db.execute(f"SELECT * FROM {table}").fetchall()
                for table in ("experiments", "runs", "model_versions")}


def test_reroot_moves_only_uris_under_the_recorded_root(tmp_path):
    new = (tmp_path / "copy" / "mlartifacts").as_uri()
    db = make_store(tmp_path / "mlflow.db")
    moved = store_root.reroot(db, tracking.EXPERIMENT, new)
    assert moved == store_root.Rerooted(old=(OLD,), new=new, rows=4)
    assert dump(db) == {
        "experiments": [(0, "Default", "/work/mlruns/0"), (1, tracking.EXPERIMENT, new)],
        # a sibling whose name only starts like the root, and another store's URIs, stay as they are
        "runs": [("a", f"{new}/a/artifacts"), ("b", f"{OLD}2/b/artifacts"),
                 ("c", "file:///elsewhere/mlartifacts/c/artifacts")],
        "model_versions": [(1, f"{new}/a/artifacts/model", f"{new}/a/artifacts/model")]}
    assert store_root.reroot(db, tracking.EXPERIMENT, new) is None  # the next open: nothing to do
    assert dump(db)["runs"][0] == ("a", f"{new}/a/artifacts")


def test_reroot_leaves_what_it_does_not_recognise(tmp_path):
    assert store_root.reroot(tmp_path / "absent.db", tracking.EXPERIMENT, OLD) is None
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()  # a store MLflow has not initialised yet
    assert store_root.reroot(empty, tracking.EXPERIMENT, OLD) is None
    # an artifact location the user chose (not a state dir's mlartifacts/) is theirs, not a record to follow
    chosen = make_store(tmp_path / "chosen.db", experiment_root="file:///bucket/draftwheel")
    before = dump(chosen)
    assert store_root.reroot(chosen, tracking.EXPERIMENT, (tmp_path / "mlartifacts").as_uri()) is None
    assert dump(chosen) == before


def test_a_locked_store_fails_and_changes_nothing(tmp_path):
    db = make_store(tmp_path / "mlflow.db")
    before = dump(db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing, for longer than the wait
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            store_root.reroot(db, tracking.EXPERIMENT, (tmp_path / "mlartifacts").as_uri(), timeout_s=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert dump(db) == before


def test_a_corrupt_store_is_one_clear_registry_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlflow.db").write_bytes(b"not a database, " * 64)
    with pytest.raises(tracking.RegistryError) as info:
        tracking.aliases()
    message = str(info.value)
    assert "\n" not in message and str(tmp_path / "mlflow.db") in message and "not a database" in message
