"""The flywheel flow end to end on tiny models, under the session's Prefect test server.

Which draft the (stand-in) trainer returns, `good` (the target's own function) or `bad` (random),
decides deterministically whether the candidate beats the champion (see toy_world). Mining, shadow
replay, the gate and the MLflow registry are the real ones.
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path

import pytest

from draftwheel import home, tracking
from draftwheel.flows.commands import main
from draftwheel.config import ConfigError, load_config
from draftwheel.locks import LockedError, state_lock
from draftwheel.registry_names import CHAMPION_URI, SHADOW_REPORT_TAG, TARGET_SHA_TAG
from draftwheel.flows.artifacts import GATE_KEY, GATE_SLICES_KEY, SHADOW_KEY
from draftwheel.flows.flywheel import FlywheelConfig, StageError, flywheel, override
from draftwheel.flows.tasks import datasets_sha256
from draftwheel.mining import corpus
from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.engine.models import weights_sha256
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.sink import JsonlSink
from tests.conftest import make_champion
from tests.flows.conftest import artifacts_of
from tests.flows.toy_world import build_models, register_drafts, word_salads

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TRAINER = "tests.flows.toy_trainers:copy_model"


@pytest.fixture(scope="module")
def world(tmp_path_factory, prefect_server, one_torch_thread):
    root = tmp_path_factory.mktemp("flywheel")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTWHEEL_HOME", str(root / "home"))
        dirs = build_models(root)
        versions = register_drafts(dirs, ("bad", "good"))
        make_champion(versions["bad"])
        logs = root / "logs"
        with JsonlSink(logs) as sink:
            engine = engine_from_specs(dirs["target"], CHAMPION_URI, sink=sink)
            for row in word_salads(16):
                engine.generate([row["prompt"]], SamplingParams(max_new_tokens=12, k=4), slice=row["slice"], chat=True)
        yield {"root": root, "dirs": dirs, "versions": versions, "logs": logs}


SHADOW = ["max_new_tokens=12", "min_requests=4", "include_canary=false"]
# The drafts alone, on mean accepted length: greedy figures, so the gate's verdict does not hang on timed
# costs (as served, the hybrid's step choices and the modelled speedup follow them; on a loaded machine a
# clear winner's gain interval can then touch 0). For tests about something other than the gate.
DRAFTS_ALONE = ["suffix_tier=false", "metric=mean_accepted_length"]


def run_flywheel(world, trainer=TRAINER, source="good", extra=(), shadow=tuple(SHADOW), train=None,
                 mining=("holdout_fraction=0.5",), settings=(), return_state=False):
    return flywheel(None, [
        f"trainer={trainer}", f"target={world['dirs']['target']}", f"logs_dir={world['logs']}",
        override("train_overrides", train if train is not None else [f"source={world['dirs'][source]}", *extra]),
        override("mining_overrides", list(mining)),
        override("shadow_overrides", list(shadow)),
        # The module's rounds share one state dir and mine the same logs again and again.
        "focus_new_traffic=false", *settings,
    ], return_state=return_state)


def serve_salads(world, logs, n, seed):
    """Serve `n` word-salad requests with the champion, logged to `logs`."""
    with JsonlSink(logs) as sink:
        engine = engine_from_specs(world["dirs"]["target"], CHAMPION_URI, sink=sink)
        for row in word_salads(n, seed=seed):
            engine.generate([row["prompt"]], SamplingParams(max_new_tokens=12, k=4), slice=row["slice"], chat=True)


def last_run(world, name):
    """(status, tags, {descendant name: status}) of the newest MLflow run called `name`, read straight from
    the sqlite store; descendants are the attempts and, under them, the stages (names unique per attempt)."""
    with sqlite3.connect(world["root"] / "home" / "mlflow.db") as db:
        run_id, status = db.execute("SELECT run_uuid, status FROM runs WHERE name = ? ORDER BY start_time DESC "
                                    "LIMIT 1", (name,)).fetchone()
        tags = dict(db.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)).fetchall())
        descendants, parents = {}, [run_id]
        while parents:
            rows = db.execute("SELECT r.run_uuid, r.name, r.status FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                              f"WHERE t.key = 'mlflow.parentRunId' AND t.value IN ({','.join('?' * len(parents))})",
                              parents).fetchall()
            descendants.update({name: status for _, name, status in rows})
            parents = [run for run, _, _ in rows]
    return status, tags, descendants


def test_flywheel_promotes_a_better_candidate(world):
    make_champion(world["versions"]["bad"])
    state = run_flywheel(world, source="good", return_state=True)
    result = state.result()
    assert result["promoted"], result["decision"]
    aliases = tracking.aliases()
    assert aliases["champion"] == aliases["challenger"] == result["challenger_version"]
    assert aliases["previous"] == world["versions"]["bad"]
    report = json.loads(open(result["report_path"]).read())
    # alone, the challenger is the target's own function (as served, the suffix index drafts some steps too)
    assert report["overall"]["challenger"]["draft_alone"]["acceptance_rate"] == 1.0
    assert report["overall"]["champion"]["draft_alone"]["acceptance_rate"] < 0.5
    assert report["overall"]["difference"]["ci_low"] > 0
    tags = tracking.get_version_tags(result["challenger_version"])
    assert tags[TARGET_SHA_TAG] == weights_sha256(world["dirs"]["target"])
    assert tags["manifest_sha256"] and json.loads(tags["shadow_decision"])["promote"] is True
    summary = json.loads(tags[SHADOW_REPORT_TAG])  # the same summary the command line writes
    assert summary["promote"] and summary["report"] == result["report_path"]
    status, _, children = last_run(world, "flywheel")
    assert status == "FINISHED"
    assert {"resolve", "attempt-1", "mine", "train", "shadow", "register", "promote"} <= set(children)
    assert "attempt-2" not in children and result["attempts"][0]["next"] is None  # promoted: no retry
    # the round's mined rows are kept for the rounds after it (draftwheel.mining.corpus)
    assert sum(corpus.sizes(home.state_dir() / "corpus").values()) > 0
    # The report is logged once, on the shadow stage run itself (no nested run of its own).
    with sqlite3.connect(world["root"] / "home" / "mlflow.db") as db:
        shadow_run, = db.execute("SELECT run_uuid FROM runs WHERE name = 'shadow' ORDER BY start_time DESC "
                                 "LIMIT 1").fetchone()
        nested = db.execute("SELECT COUNT(*) FROM tags WHERE key = 'mlflow.parentRunId' AND value = ?",
                            (shadow_run,)).fetchone()[0]
        params = dict(db.execute("SELECT key, value FROM params WHERE run_uuid = ?", (shadow_run,)).fetchall())
    assert nested == 0 and params["shadow.min_requests"] == "4"
    check_gate_artifacts(state.state_details.flow_run_id, report, world["versions"]["bad"])


def check_gate_artifacts(flow_run_id, report, champion_version):
    """The flow run's Prefect artifacts, read back through the API, say what the shadow report says: the
    decision with every check's line, the per-slice intervals, and champion vs challenger as served and alone."""
    made = artifacts_of(flow_run_id)
    decision = report["decision"]
    gate, = made[GATE_KEY]
    assert gate.startswith(f"# Gate: {'PROMOTE' if decision['promote'] else 'reject'}")
    assert f"vs champion v{champion_version}" in gate and all(reason in gate for reason in decision["reasons"])
    slices, = made[GATE_SLICES_KEY]
    assert [row["group"] for row in slices] == [v["group"] for v in decision["slices"]] and slices
    for row, verdict in zip(slices, decision["slices"]):
        assert (row["n"], row["ci_low"], row["ci_high"]) == (verdict["n"], f"{verdict['ci_low']:+.1%}",
                                                             f"{verdict['ci_high']:+.1%}")
        assert row["verdict"] == ("ok" if verdict["ok"] else "VETO")
    shadow, = made[SHADOW_KEY]
    overall = shadow[0]
    assert overall["slice"] == "overall" and overall["n"] == report["overall"]["n"]
    for arm in ("champion", "challenger"):
        figures = report["overall"][arm]
        assert overall[f"{arm}_served_mal"] == round(figures["mean_accepted_length"], 3)
        assert overall[f"{arm}_served_speedup"] == round(figures["served_speedup"], 3)
        assert overall[f"{arm}_alone_mal"] == round(figures["draft_alone"]["mean_accepted_length"], 3)
    assert [row["slice"] for row in shadow[1:]] == sorted(report["slices"])


def test_flywheel_refuses_a_worse_candidate(world):
    make_champion(world["versions"]["good"])
    state = run_flywheel(world, source="bad", return_state=True)
    result = state.result()
    check_gate_artifacts(state.state_details.flow_run_id, json.loads(open(result["report_path"]).read()),
                         world["versions"]["good"])
    assert not result["promoted"]
    assert any(reason.startswith("FAIL") for reason in result["decision"]["reasons"])
    aliases = tracking.aliases()
    assert aliases["champion"] == world["versions"]["good"]  # untouched
    assert aliases.get("challenger") != result["challenger_version"]  # as on the command line: rejected
    assert not json.loads(tracking.get_version_tags(result["challenger_version"])[SHADOW_REPORT_TAG])["promote"]
    status, tags, _ = last_run(world, "flywheel")
    assert status == "FINISHED" and tags["promoted"] == "False"


def test_a_failed_stage_leaves_the_champion_and_fails_the_run(world):
    make_champion(world["versions"]["bad"])
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
    from draftwheel.flows.monitor import monitor

    make_champion(world["versions"]["bad"])  # the champion that served the logged traffic
    common = [f"logs_dir={world['logs']}", f"target={world['dirs']['target']}", "run_flywheel=false",
              "window_requests=16", "min_requests=4"]
    low = monitor(None, common + ["min_acceptance=0.5"])
    assert low["decision"]["trigger"] and low["decision"]["requests"]["overall"] == 16
    assert not monitor(None, common + ["min_acceptance=0.0", "min_served_mal=0"])["decision"]["trigger"]
    slow = monitor(None, common + ["min_acceptance=0.0", "min_served_mal=10"])["decision"]  # as served, checked first
    assert slow["trigger"] and slow["reasons"][0].startswith("as served: mean accepted length")
    # A new champion has served nothing yet: the old champion's records are not held against it.
    make_champion(world["versions"]["good"])
    fresh = monitor(None, common + ["min_acceptance=0.5"])
    assert not fresh["decision"]["trigger"] and fresh["decision"]["requests"]["overall"] == 0
    # Serving a different target than the champion was trained for triggers on its own.
    moved = monitor(None, common[:1] + [f"target={world['dirs']['good']}", "run_flywheel=false"])
    assert moved["decision"]["trigger"] and "target weights changed" in moved["decision"]["reasons"][0]


def test_training_is_cached_on_unchanged_data_and_config(world):
    make_champion(world["versions"]["bad"])
    calls = world["root"] / "calls.txt"
    first = run_flywheel(world, source="good", extra=[f"calls={calls}"], shadow=SHADOW + DRAFTS_ALONE)
    make_champion(world["versions"]["bad"])  # same champion, same logs, same config
    second = run_flywheel(world, source="good", extra=[f"calls={calls}"], shadow=SHADOW + DRAFTS_ALONE)
    assert len(calls.read_text().splitlines()) == 1  # the second run reused the candidate
    assert second["candidate_dir"] == first["candidate_dir"] and second["promoted"]


def test_status_prints_every_version_the_flywheel_created(world, capsys):
    """Probe 1: `draftwheel status` crashed (JSONDecodeError) after any flywheel run."""
    make_champion(world["versions"]["bad"])
    promoted = run_flywheel(world, source="good")
    make_champion(world["versions"]["good"])
    rejected = run_flywheel(world, source="bad")
    capsys.readouterr()
    assert main(["status"]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert " pass +" in rows[promoted["challenger_version"]] and " fail " in rows[rejected["challenger_version"]]
    assert all(version in rows for version in world["versions"].values())


def test_bad_stage_config_fails_before_the_first_stage(world):
    """Probe 10: a bad shadow_overrides field used to fail after mining and training."""
    before = len(list((world["root"] / "home" / "flywheel").glob("*")))
    with pytest.raises(ConfigError, match="shadow stage.*no_such_field"):
        run_flywheel(world, shadow=SHADOW + ["no_such_field=1"])
    with pytest.raises(ConfigError, match="train stage.*beta"):
        run_flywheel(world, trainer="distill", train=["beta=5"])
    assert len(list((world["root"] / "home" / "flywheel").glob("*"))) == before  # no stage ran


def test_a_second_run_on_the_same_state_dir_is_refused(world):
    """Probe 5: two runs on one state dir both promoted against the same champion."""
    before = tracking.aliases()
    with state_lock("flywheel"), pytest.raises(LockedError, match="flywheel.lock"):
        run_flywheel(world, source="good")
    assert tracking.aliases() == before


def test_no_promotion_against_a_champion_that_moved_during_the_run(world):
    """Probe 5: a promotion made while this run trained (here by hand, mid-training) is not overridden by
    a candidate gated against the old champion; `previous` stays a version that served."""
    make_champion(world["versions"]["good"])
    make_champion(world["versions"]["bad"])  # champion bad, previous good
    with pytest.raises(StageError, match="gated against champion version") as info:
        run_flywheel(world, source="good", extra=[f"promote={world['versions']['good']}"])
    assert info.value.stage == "promote"
    aliases = tracking.aliases()
    assert aliases["champion"] == world["versions"]["good"] and aliases["previous"] == world["versions"]["bad"]


# The copy of the champion changes nothing; with a zero slice tolerance and min_gain -1 the gate rejects it on
# the slice checks alone (every slice's CI is [0, 0], not above -0), the case a retry is for.
SLICE_ONLY = SHADOW + DRAFTS_ALONE + ["min_gain=-1", "slice_tolerance=0", "min_slice_requests=3"]
# One hard sample per slice and no rollback/uniform ones: the rest of each slice is left for replay.
LEAN_MINING = ["holdout_fraction=0.5", "max_rollback_per_slice=0", "uniform_ratio=0"]


def _replay_sensitive(world, **kw):
    return run_flywheel(world, trainer="tests.flows.toy_trainers:replay_sensitive", shadow=SLICE_ONLY,
                        mining=LEAN_MINING, train=[f"first={world['dirs']['bad']}", f"source={world['dirs']['good']}"],
                        **kw)


def test_a_slice_only_rejection_is_retried_once_with_more_replay(world):
    make_champion(world["versions"]["bad"])
    result = _replay_sensitive(world)
    first, second = result["attempts"]
    assert first["decision"]["failed_checks"] == ["slice"] and first["decision"]["blocking_slices"] == ["chat", "code"]
    assert first["replay_boost"] == {} and first["next"].startswith("retry: slice regression on chat, code")
    assert second["replay_boost"] == {"chat": 3.0, "code": 3.0} and second["decision"]["promote"]
    assert result["promoted"] and tracking.aliases()["champion"] == second["challenger_version"]
    assert not json.loads(tracking.get_version_tags(first["challenger_version"])[SHADOW_REPORT_TAG])["promote"]
    assert "chat x3, code x3" in result["tried"][1] and "rejected (slice; blocking chat, code)" in result["tried"][0]
    manifest = json.loads(Path(result["manifest_path"]).read_text())
    assert manifest["replay"]["boost"] == {"chat": 3.0, "code": 3.0}
    assert json.loads((Path(result["work_dir"]).parent / "result.json").read_text())["tried"] == result["tried"]
    status, tags, runs = last_run(world, "flywheel")
    assert status == "FINISHED" and runs["attempt-1"] == runs["attempt-2"] == "FINISHED"
    assert tags["attempts"] == "2" and tags["blocking_slices"] == ""


def test_a_retry_for_slices_with_nothing_to_replay_hands_the_trainer_more_rehearsal_and_retrains(world, tmp_path):
    """With no replay in the mined mix (`replay_share=0`) the blocking slices have nothing to replay, so the
    retry's one lever is the trainer's rehearsal: the eagle trainer's `rehearsal_ratio` (2 in
    configs/eagle.yaml) times 3. The stand-in launcher (tests/flows/stand_in_launcher.py) records the
    overrides each call receives: the second call gets `rehearsal_ratio=6`, and it is a second call at all,
    into a new candidate dir, because the override is part of training's cache key. Both attempts mined the
    same data (no corpus, no replay boost), so were the override dropped the retry would have the first
    attempt's key and get its cached candidate back, rejected again."""
    make_champion(world["versions"]["bad"])
    calls = tmp_path / "calls.jsonl"
    launcher = (f"{sys.executable} {Path(__file__).parent / 'stand_in_launcher.py'} --calls {calls} "
                f"--first {world['dirs']['bad']} --then {world['dirs']['good']}")
    result = run_flywheel(world, trainer="eagle", train=[], shadow=SLICE_ONLY + DRAFTS_ALONE,
                          mining=LEAN_MINING + ["replay_share=0"],
                          settings=[f"launcher={launcher}", "corpus=false"])
    first, second = [json.loads(line) for line in calls.read_text().splitlines()]
    attempt_dirs = [Path(result["work_dir"]).parent, Path(result["work_dir"])]
    assert attempt_dirs[1].name == "attempt-2"
    assert datasets_sha256(attempt_dirs[0] / "datasets") == datasets_sha256(attempt_dirs[1] / "datasets")
    assert first["module"] == second["module"] == "draftwheel.training.eagle_train"
    assert not any(item.startswith("rehearsal_ratio=") for item in first["overrides"])
    assert "rehearsal_ratio=6" in second["overrides"]
    out_dir = [dict(item.split("=", 1) for item in call["overrides"])["output_dir"] for call in (first, second)]
    assert out_dir[0] != out_dir[1]  # a new cache key, a new candidate
    attempt_1, attempt_2 = result["attempts"]
    assert attempt_1["decision"]["failed_checks"] == ["slice"] and attempt_1["replay_boost"] == {}
    assert "rehearsal x3 (rehearsal_ratio 2 -> 6)" in attempt_1["next"]
    assert attempt_2["rehearsal"] == 6.0 and attempt_2["decision"]["promote"], result["decision"]["reasons"]
    assert result["promoted"] and tracking.aliases()["champion"] == attempt_2["challenger_version"]
    _, _, runs = last_run(world, "flywheel")
    assert runs["attempt-1"] == runs["attempt-2"] == "FINISHED"


def test_retries_stop_at_max_retries_and_the_report_names_the_blocking_slices(world):
    make_champion(world["versions"]["bad"])
    result = _replay_sensitive(world, settings=["max_retries=0"])
    assert not result["promoted"] and len(result["attempts"]) == 1
    assert result["blocking_slices"] == ["chat", "code"] and result["attempts"][0]["next"] == "stop: max_retries reached"
    status, tags, runs = last_run(world, "flywheel")
    assert tags["blocking_slices"] == "chat,code" and "attempt-2" not in runs


def test_monitor_reports_the_delivered_gain_after_a_promotion(world, tmp_path, capsys):
    """The promoted champion's live figures per slice against the previous champion's, from the logs; the
    registry version carries them and `draftwheel status` shows them."""
    from draftwheel.flows.monitor import monitor

    logs = tmp_path / "logs"
    for champion in ("bad", "good"):  # bad served, then good was promoted and served
        make_champion(world["versions"][champion])
        serve_salads(world, logs, 6, seed=3)
    assert tracking.aliases()["previous"] == world["versions"]["bad"]
    result = monitor(None, [f"logs_dir={logs}", f"target={world['dirs']['target']}", "run_flywheel=false",
                            "window_requests=16", "min_requests=4"])
    delivered = result["delivered"]
    assert delivered["champion"] == world["versions"]["good"] and delivered["previous"] == world["versions"]["bad"]
    for name in ("chat", "code"):
        entry = delivered["slices"][name]
        assert entry["champion"]["requests"] == entry["previous"]["requests"] == 3
        assert entry["champion"]["acceptance_rate"] == 1.0 and entry["mal_change"] > 0  # the target's own function
        low, high = entry["mal_change_ci"]
        assert low <= entry["mal_change"] <= high
    tags = tracking.get_version_tags(world["versions"]["good"])
    assert json.loads(tags["delivered_gain"])["slices"]["code"]["mal_change"] == delivered["slices"]["code"]["mal_change"]
    _, run_tags, _ = last_run(world, "monitor")
    assert run_tags["champion_version"] == world["versions"]["good"]
    capsys.readouterr()
    assert main(["status"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.split()[1] == world["versions"]["good"])
    assert re.search(r"chat \d\.\d\d \+\d+% \[[+-]\d+%,[+-]\d+%\] n=3; code \d\.\d\d \+\d+% \[[+-]\d+%,[+-]\d+%\] n=3",
                     row), row


def test_monitor_holds_its_trigger_after_a_rejected_round_until_new_traffic(world, tmp_path):
    """A rejected round leaves the same low acceptance in the logs: re-triggering on them would train the
    same challenger again. The monitor waits for `retrigger_after_requests` requests served since."""
    from draftwheel.flows.monitor import monitor

    make_champion(world["versions"]["bad"])
    logs = tmp_path / "logs"

    common = [f"logs_dir={logs}", f"target={world['dirs']['target']}", "run_flywheel=false", "window_requests=16",
              "min_requests=4", "min_acceptance=0.5", "retrigger_after_requests=6"]
    serve_salads(world, logs, 8, seed=5)
    assert monitor(None, common)["decision"]["trigger"]
    rejected = run_flywheel(world, source="bad")  # the champion's own weights: no gain, rejected
    assert not rejected["promoted"]
    held = monitor(None, common)["decision"]
    assert not held["trigger"] and held["reasons"]  # still low, but no new evidence
    assert held["held"].startswith(f"v{rejected['challenger_version']} was rejected") and "0 of 6" in held["held"]
    assert monitor(None, common + ["retrigger_after_requests=0"])["decision"]["trigger"]
    serve_salads(world, logs, 6, seed=6)
    assert monitor(None, common)["decision"]["trigger"]


def test_each_round_focuses_on_the_traffic_served_since_the_last_round(world, tmp_path):
    """The corpus remembers the newest request a round mined; the next round's hard, rollback and uniform
    samples and its hold-out come only from later traffic (earlier rounds' rows join through the corpus);
    with nothing served since, the round stops at mining. With `focus_new_traffic` off a round mines every
    request again."""
    make_champion(world["versions"]["bad"])
    logs = tmp_path / "logs"

    def mined(result):
        manifest = json.loads(Path(result["manifest_path"]).read_text())
        return manifest, sum(entry["train_pool"] for entry in manifest["slices"].values())

    settings = [f"corpus_dir={tmp_path / 'corpus'}", "promote=false", "max_retries=0", "focus_new_traffic=true"]
    world = {**world, "logs": logs}
    serve_salads(world, logs, 12, seed=11)
    first, pool = mined(run_flywheel(world, source="bad", settings=settings))
    assert first["focus_after_ts"] is None and pool == 12 - first["counts"]["holdout_window"]
    assert corpus.mined_until(tmp_path / "corpus") == first["newest_ts"]
    with pytest.raises(StageError, match="no requests served since the last round mined") as failed:
        run_flywheel(world, source="bad", settings=settings)  # nothing served since: nothing new to learn
    assert failed.value.stage == "mine" and corpus.mined_until(tmp_path / "corpus") == first["newest_ts"]
    serve_salads(world, logs, 8, seed=12)
    later, pool = mined(run_flywheel(world, source="bad", settings=settings))
    assert later["focus_after_ts"] == first["newest_ts"] and 0 < pool <= 8
    again, pool = mined(run_flywheel(world, source="bad", settings=[*settings, "focus_new_traffic=false"]))
    assert again["focus_after_ts"] is None and pool == 20 - again["counts"]["holdout_window"]


def test_training_prediction_sits_beside_what_the_gate_measured():
    """The challenger's probe (serving's walk with the chain cut, and the teacher-forced figure) beside
    the gate's replay of the same draft alone and as served; the gap is walk minus alone. Trainers
    without the probe, or gates without draft-alone replays, give None rather than a made-up figure."""
    from draftwheel.flows.flywheel import prediction_against_gate

    info = {"metrics": {"eval_served_mal": 1.62, "eval_implied_mal": 1.85}}
    report = {"overall": {"challenger": {"mean_accepted_length": 2.28,
                                         "draft_alone": {"mean_accepted_length": 1.50}}}}
    predicted = prediction_against_gate(info, report)
    assert predicted == pytest.approx({"implied_mal": 1.85, "walk_mal": 1.62, "gate_alone_mal": 1.50,
                                       "gate_served_mal": 2.28, "walk_gap": 0.12})
    assert prediction_against_gate({"metrics": {}}, report) is None
    assert prediction_against_gate(info, {"overall": {"challenger": {"mean_accepted_length": 2.28}}}) is None


def test_the_trainers_probe_walks_the_chains_the_gate_replays_unless_the_round_says_otherwise():
    """The eagle trainer's per-epoch probe gets the shadow stage's k and chain cut (distill, which has no
    chain cut, gets k); the round's own train_overrides come later and win; a trainer outside draftwheel
    gets nothing it might not accept."""
    from draftwheel.flows.flywheel import _probe_settings, _shadow_settings
    from draftwheel.training.eagle_train import EagleConfig

    gate = ["k=5", "min_path_prob=0.15"]
    eagle = FlywheelConfig(trainer="eagle", shadow_overrides=gate, train_overrides=["eval_k=3"])
    probe = _probe_settings(eagle.trainer, _shadow_settings(eagle))
    assert probe == ["eval_k=5", "eval_min_path_prob=0.15"]
    settings = load_config(EagleConfig, str(CONFIGS / "eagle.yaml"), probe + eagle.train_overrides)
    assert (settings.eval_k, settings.eval_min_path_prob) == (3, 0.15)
    assert _probe_settings("distill", _shadow_settings(eagle)) == ["eval_k=5"]
    assert _probe_settings(TRAINER, _shadow_settings(eagle)) == []
    shipped = load_config(EagleConfig, str(CONFIGS / "eagle.yaml"),
                          _probe_settings("eagle", _shadow_settings(FlywheelConfig(trainer="eagle"))))
    assert (shipped.eval_k, shipped.eval_min_path_prob) == (4, 0.25)  # shadow.yaml's, as eagle.yaml already says


def test_a_cached_candidate_from_a_copied_state_dirs_original_is_read_in_the_copy(tmp_path, monkeypatch):
    """Prefect's cache travels with a copied state dir: its cached training result names the original's
    candidate dir. The copy's own candidate at the same cache key is read instead; a candidate a custom
    trainer wrote outside the state dir, with nothing at `out_dir`, is kept as it is."""
    from draftwheel.flows.flywheel import candidate_dir

    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "copy"))
    out_dir = tmp_path / "copy" / "models" / "candidates" / "k"
    original = tmp_path / "original" / "models" / "candidates" / "k"
    assert candidate_dir(original, out_dir) == original  # nothing in the copy yet
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text("{}")
    assert candidate_dir(original, out_dir) == out_dir
    assert candidate_dir(out_dir, out_dir) == out_dir
