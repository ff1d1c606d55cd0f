"""The registry's failure paths through the command line, on a real sqlite registry:
promote refuses versions serving would refuse, alias moves are all or nothing and take turns under a
file lock, status shows aliases pointing at versions the registry lost and versions whose files are gone.
Its own module, hence its own state dir and registry: the alias histories here start empty.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time

import pytest

from draftwheel import home as state, tracking
from draftwheel.locks import LockedError, state_lock
from draftwheel.registry_names import SHADOW_REPORT_TAG, TARGET_SHA_TAG
from tests.draftwheel.test_registry_cli import run
from tests.draftwheel.test_tracking import fake_model_dir, stored_dir


@pytest.fixture(scope="module")
def home(module_home):
    return module_home


def fresh_model(name: str, tmp_path, target: str = "ab") -> str:
    """A version of a registered model of its own (so alias histories do not mix), trained for `target`."""
    return tracking.register_draft(fake_model_dir(tmp_path / name, name.encode()), {TARGET_SHA_TAG: target * 32},
                                   name="draftwheel-draft")


def test_status_survives_a_shadow_report_tag_written_as_a_path(home, tmp_path, capsys):
    """Probe 1: the flywheel used to store `shadow_report` as a path; status parsed it as JSON and crashed."""
    version = fresh_model("pathtag", tmp_path)
    tracking.set_version_tags(version, {SHADOW_REPORT_TAG: "/some/run/shadow/report.json"})
    assert run("status") == 0
    assert "report /some/run/shadow/report.json" in capsys.readouterr().out


def test_promote_refuses_what_serving_would_refuse(home, tmp_path, capsys):
    """Probe 11/9: a version trained for another target, or whose files were deleted, is not promoted;
    one line, exit 2, aliases untouched."""
    champion = fresh_model("servable", tmp_path)
    assert run("promote", champion) == 0
    capsys.readouterr()
    other = fresh_model("other-target", tmp_path, target="cd")
    before = tracking.aliases()
    assert run("promote", other) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "trained for target cdcdcdcdcdcd" in err and "abababababab" in err
    gone = fresh_model("deleted-files", tmp_path)
    shutil.rmtree(stored_dir(gone))
    assert run("promote", gone) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"version {gone}: artifacts missing" in err
    assert tracking.aliases() == before
    assert run("status") == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert any(row[1] == gone and row[-2:] == ["FILES", "MISSING"] for row in rows)


def test_status_shows_an_alias_pointing_at_a_missing_version_and_rollback_moves_nothing(home, tmp_path, capsys):
    """Probe 11: the champion alias points at a version the registry lost (row deleted). status must show
    it; rollback used to move `champion` and then exit 1 when setting `previous` failed."""
    first, second = fresh_model("lost-1", tmp_path), fresh_model("lost-2", tmp_path)
    assert run("promote", first) == 0 and run("promote", second) == 0
    capsys.readouterr()
    with sqlite3.connect(state.state_dir() / "mlflow.db") as db:
        for table in ("model_version_tags", "model_versions"):  # the version is gone; its alias stays
            db.execute(f"DELETE FROM {table} WHERE name = 'draftwheel-draft' AND version = ?", (int(second),))
    assert run("status") == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["draftwheel-draft", second, "champion"] + ["-"] * 6 + ["VERSION", "MISSING"] in rows
    before = tracking.aliases()
    assert run("rollback") == 1
    assert f"draftwheel promote {first}" in capsys.readouterr().err
    assert tracking.aliases() == before  # all or nothing: nothing moved


def test_alias_moves_wait_for_the_registry_lock(home, tmp_path, capsys):
    """Probe 5: alias moves on one state dir take turns (a file lock); a lock that stays taken is an
    error naming the lock file."""
    version = fresh_model("locked", tmp_path)
    held = threading.Event()

    def hold() -> None:
        with state_lock("registry"):
            held.set()
            time.sleep(1.0)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    started = time.monotonic()
    assert run("promote", version) == 0  # waited for the holder, then moved the aliases
    assert time.monotonic() - started >= 0.8
    holder.join()
    with state_lock("flywheel"):
        with pytest.raises(LockedError, match=r"locked by another process \(pid \d+, lock file .*flywheel.lock\)"):
            with state_lock("flywheel"):
                pass
