"""The flywheel flow end to end on tiny models, under the session's Prefect test server.

Which draft the (stand-in) trainer returns, `good` (the target's own function) or `bad` (random),
decides deterministically whether the candidate beats the champion (see toy_world). Mining, shadow
replay, the gate and the MLflow registry are the real ones.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from draftwheel import tracking
from draftwheel.config import ConfigError, load_config
from flows.flywheel import FlywheelConfig, StageError, flywheel, override
from serving.engine import Engine
from serving.models import weights_sha256
from serving.params import SamplingParams
from serving.sink import JsonlSink
from tests.flows.toy_world import build_models

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TRAINER = "tests.flows.toy_trainers:copy_model"
WORDS = ("sea sky fox dog poem stack list items read write test class return import print line "
         "question lazy brown quick help today short things") .split()


@pytest.fixture(scope="module")
def world(tmp_path_factory, prefect_server, one_torch_thread):
    root = tmp_path_factory.mktemp("flywheel")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTWHEEL_HOME", str(root / "home"))
        dirs = build_models(root)
        tags = {"target_sha256": weights_sha256(dirs["target"])}
        versions = {name: tracking.register_draft(dirs[name], tags) for name in ("bad", "good")}
        tracking.promote(versions["bad"])
        logs = root / "logs"
        rng = random.Random(0)
        with JsonlSink(logs) as sink:
            engine = Engine.from_paths(dirs["target"], "models:/draftwheel-draft@champion", sink=sink)
            for i in range(16):  # random word salads: distinct prompts that survive near-dedupe
                prompt = " ".join(rng.choice(WORDS) for _ in range(8))
                engine.generate([prompt], SamplingParams(max_new_tokens=12, k=4), slice=("chat", "code")[i % 2],
                                chat=True)
        yield {"root": root, "dirs": dirs, "versions": versions, "logs": logs}


def run_flywheel(world, trainer=TRAINER, source="good", extra=()):
    return flywheel(None, [
        f"trainer={trainer}", f"target={world['dirs']['target']}", f"logs_dir={world['logs']}",
        override("train_overrides", [f"source={world['dirs'][source]}", *extra]),
        override("mining_overrides", ["holdout_fraction=0.5"]),
        override("shadow_overrides", ["max_new_tokens=12", "min_requests=4", "include_canary=false"]),
    ])


def last_run(world, name):
    """(status, tags) of the newest MLflow run called `name`, read straight from the sqlite store."""
    with sqlite3.connect(world["root"] / "home" / "mlflow.db") as db:
        run_id, status = db.execute("SELECT run_uuid, status FROM runs WHERE name = ? ORDER BY start_time DESC "
                                    "LIMIT 1", (name,)).fetchone()
        tags = dict(db.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)).fetchall())
        children = db.execute("SELECT r.name, r.status FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                              "WHERE t.key = 'mlflow.parentRunId' AND t.value = ?", (run_id,)).fetchall()
    return status, tags, dict(children)


def test_flywheel_promotes_a_better_candidate(world):
    tracking.promote(world["versions"]["bad"])
    result = run_flywheel(world, source="good")
    assert result["promoted"], result["decision"]
    aliases = tracking.aliases()
    assert aliases["champion"] == aliases["challenger"] == result["challenger_version"]
    assert aliases["previous"] == world["versions"]["bad"]
    report = json.loads(open(result["report_path"]).read())
    assert report["overall"]["challenger"]["acceptance_rate"] == 1.0  # the target's own function
    assert report["overall"]["champion"]["acceptance_rate"] < 0.5
    assert report["overall"]["difference"]["ci_low"] > 0
    tags = tracking.get_version_tags(result["challenger_version"])
    assert tags["target_sha256"] == weights_sha256(world["dirs"]["target"])
    assert tags["manifest_sha256"] and json.loads(tags["shadow_decision"])["promote"] is True
    status, _, children = last_run(world, "flywheel")
    assert status == "FINISHED"
    assert {"resolve", "mine", "train", "shadow", "register", "promote"} <= set(children)
    # The report is logged once, on the shadow stage run itself (no nested run of its own).
    with sqlite3.connect(world["root"] / "home" / "mlflow.db") as db:
        shadow_run, = db.execute("SELECT run_uuid FROM runs WHERE name = 'shadow' ORDER BY start_time DESC "
                                 "LIMIT 1").fetchone()
        nested = db.execute("SELECT COUNT(*) FROM tags WHERE key = 'mlflow.parentRunId' AND value = ?",
                            (shadow_run,)).fetchone()[0]
        params = dict(db.execute("SELECT key, value FROM params WHERE run_uuid = ?", (shadow_run,)).fetchall())
    assert nested == 0 and params["shadow.min_requests"] == "4"


def test_flywheel_refuses_a_worse_candidate(world):
    tracking.promote(world["versions"]["good"])
    result = run_flywheel(world, source="bad")
    assert not result["promoted"]
    assert any(reason.startswith("FAIL") for reason in result["decision"]["reasons"])
    aliases = tracking.aliases()
    assert aliases["champion"] == world["versions"]["good"]  # untouched
    assert aliases["challenger"] == result["challenger_version"]
    status, tags, _ = last_run(world, "flywheel")
    assert status == "FINISHED" and tags["promoted"] == "False"


def test_a_failed_stage_leaves_the_champion_and_fails_the_run(world):
    tracking.promote(world["versions"]["bad"])
    before = tracking.aliases()
    with pytest.raises(StageError, match="out of memory") as info:
        run_flywheel(world, trainer="tests.flows.toy_trainers:broken")
    assert info.value.stage == "train"
    assert tracking.aliases() == before
    status, tags, children = last_run(world, "flywheel")
    assert status == "FAILED"
    assert tags["failed_stage"] == "train" and "out of memory" in tags["failure_reason"]
    assert children["mine"] == "FINISHED" and children["train"] == "FAILED" and "shadow" not in children


def test_flywheel_config_file_and_validation(tmp_path):
    assert load_config(FlywheelConfig, CONFIGS / "flywheel.yaml") == FlywheelConfig()
    with pytest.raises(ValueError, match="trainer"):
        load_config(FlywheelConfig, None, ["trainer=magic"])
    with pytest.raises(ValueError, match="train_config"):
        load_config(FlywheelConfig, None, [f"train_config={tmp_path / 'missing.yaml'}"])
    with pytest.raises(ConfigError, match="trainr"):
        load_config(FlywheelConfig, None, ["trainr=dpo"])


def test_monitor_flow_reads_the_logs_and_triggers_or_not(world):
    from flows.monitor import monitor

    tracking.promote(world["versions"]["bad"])  # the champion that served the logged traffic
    common = [f"logs_dir={world['logs']}", f"target={world['dirs']['target']}", "run_flywheel=false",
              "window_requests=16", "min_requests=4"]
    low = monitor(None, common + ["min_acceptance=0.5"])
    assert low["decision"]["trigger"] and low["decision"]["requests"]["overall"] == 16
    assert not monitor(None, common + ["min_acceptance=0.0"])["decision"]["trigger"]
    # A new champion has served nothing yet: the old champion's records are not held against it.
    tracking.promote(world["versions"]["good"])
    fresh = monitor(None, common + ["min_acceptance=0.5"])
    assert not fresh["decision"]["trigger"] and fresh["decision"]["requests"]["overall"] == 0
    # Serving a different target than the champion was trained for triggers on its own.
    moved = monitor(None, common[:1] + [f"target={world['dirs']['good']}", "run_flywheel=false"])
    assert moved["decision"]["trigger"] and "target weights changed" in moved["decision"]["reasons"][0]


def test_training_is_cached_on_unchanged_data_and_config(world):
    tracking.promote(world["versions"]["bad"])
    calls = world["root"] / "calls.txt"
    first = run_flywheel(world, source="good", extra=[f"calls={calls}"])
    tracking.promote(world["versions"]["bad"])  # same champion, same logs, same config
    second = run_flywheel(world, source="good", extra=[f"calls={calls}"])
    assert len(calls.read_text().splitlines()) == 1  # the second run reused the candidate
    assert second["candidate_dir"] == first["candidate_dir"] and second["promoted"]
