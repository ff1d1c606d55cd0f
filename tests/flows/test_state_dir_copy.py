"""A state dir copied or moved elsewhere works on its own, with MLflow's real sqlite store and file artifacts.

The seed state dir has a champion (`good`) and a previous version (`bad`), served traffic in its `logs/`,
and its registry download cache. Each test first makes its own "original" from it (a copy, opened once,
so it is itself a moved state dir) and copies that: the moved copy serves, rolls back, lists its files as
there and runs a flywheel round (stand-in trainer, real mining, shadow and registry) with the original
deleted; a copy beside its original loses a version's files without touching the original's; a sqlite
store outside the state dir (`MLFLOW_TRACKING_URI`) is never rewritten.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from draftwheel import home, tracking
from draftwheel.flows.commands import main
from draftwheel.registry_names import CHAMPION_URI, version_uri
from draftwheel.store_root import URI_COLUMNS
from draftwheel.flows.flywheel import flywheel, override
from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.sink import JsonlSink
from tests.conftest import make_champion
from tests.flows.toy_world import build_models, register_drafts, word_salads


@pytest.fixture(scope="module")
def seed(tmp_path_factory, prefect_server, one_torch_thread):
    root = tmp_path_factory.mktemp("state-copy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTWHEEL_HOME", str(root / "seed"))
        dirs = build_models(root / "models")  # the target stays outside the state dirs, as a user's would
        versions = register_drafts(dirs, ("bad", "good"))
        make_champion(versions["bad"])
        make_champion(versions["good"])  # champion good, previous bad
        with JsonlSink(home.logs_dir()) as sink:
            engine = engine_from_specs(dirs["target"], CHAMPION_URI, sink=sink)
            for row in word_salads(16):
                engine.generate([row["prompt"]], SamplingParams(max_new_tokens=12, k=4), slice=row["slice"], chat=True)
    yield {"root": root, "dirs": dirs, "versions": versions}


@pytest.fixture
def original(seed, tmp_path, monkeypatch, caplog):
    """A fresh state dir copied from the seed and opened once (re-rooted from the seed, with a warning)."""
    path = Path(shutil.copytree(seed["root"] / "seed", tmp_path / "original"))
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracking.list_versions()
    assert any("state dir moved or copied" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    return path


def stored_uris(state: Path) -> list[str]:
    """Every artifact URI the state dir's store holds, except the Default experiment's (MLflow's cwd)."""
    with sqlite3.connect(state / "mlflow.db") as db:
        uris = [uri for table, column in URI_COLUMNS if column in
                {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                for (uri,) in db.execute(f"SELECT {column} FROM {table}") if uri]
    return [uri for uri in uris if not uri.endswith("/mlruns/0")]


def source_dir(version: str) -> Path:
    row = next(r for r in tracking.list_versions() if r["version"] == version)
    return Path(unquote(urlparse(row["source"]).path))


def status(capsys) -> dict[str, str]:
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    return {row["version"]: row["state"] for row in json.loads(capsys.readouterr().out)}


def test_a_moved_state_dir_serves_rolls_back_and_runs_a_round(seed, original, tmp_path, monkeypatch, capsys):
    copy = Path(shutil.copytree(original, tmp_path / "copy"))
    shutil.rmtree(original)
    shutil.rmtree(copy / "models" / "registry")  # no download cache: versions come from the artifact store
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(copy))
    versions, mine = seed["versions"], copy.as_uri() + "/"

    assert load_model(CHAMPION_URI).model_id.version == versions["good"]  # the server's startup path
    assert all(uri.startswith(mine) for uri in stored_uris(copy)), stored_uris(copy)
    assert main(["rollback"]) == 0
    assert json.loads(capsys.readouterr().out) == {"champion": versions["bad"], "previous": versions["good"]}
    assert load_model(CHAMPION_URI).model_id.version == versions["bad"]
    assert set(status(capsys).values()) == {"ok"}

    result = flywheel(None, [
        "trainer=tests.flows.toy_trainers:copy_model", f"target={seed['dirs']['target']}",
        override("train_overrides", [f"source={seed['dirs']['good']}"]),
        override("mining_overrides", ["holdout_fraction=0.5"]),
        override("shadow_overrides", ["max_new_tokens=12", "min_requests=4", "include_canary=false",
                                      "suffix_tier=false", "metric=mean_accepted_length"])])
    new = result["challenger_version"]
    assert new not in versions.values()
    assert source_dir(new).is_relative_to(copy / home.ARTIFACTS_DIR)
    assert load_model(version_uri(new)).model_id.version == new
    assert all(uri.startswith(mine) for uri in stored_uris(copy)), stored_uris(copy)  # the round's runs too
    assert not original.exists()


def test_a_copy_deletes_its_own_files_not_the_originals(seed, original, tmp_path, monkeypatch, capsys):
    copy = Path(shutil.copytree(original, tmp_path / "copy"))
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(copy))
    bad = seed["versions"]["bad"]
    files = source_dir(bad)
    assert files.is_relative_to(copy)
    shutil.rmtree(files)
    assert status(capsys)[bad] == "FILES MISSING"

    monkeypatch.setenv("DRAFTWHEEL_HOME", str(original))
    assert set(status(capsys).values()) == {"ok"}
    assert (original / files.relative_to(copy)).is_dir()
    assert all(uri.startswith(original.as_uri() + "/") for uri in stored_uris(original))


def test_a_store_outside_the_state_dir_is_left_alone(original, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere" / "mlflow.db"
    elsewhere.parent.mkdir()
    shutil.copy2(original / "mlflow.db", elsewhere)
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "another-state-dir"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{elsewhere}")
    assert all(Path(urlparse(row["source"]).path).is_relative_to(original) for row in tracking.list_versions())
    assert all(uri.startswith(original.as_uri() + "/") for uri in stored_uris(elsewhere.parent))
