"""The retry policy as plain functions: when a rejected turn is retried, with which replay boost, and the report."""

from __future__ import annotations

from pathlib import Path

from draftwheel.flows.replay import attempts_report, plan_retry, served_slices
from draftwheel.evaluation.shadow import ShadowConfig

REPLAY = {"slices": {"chat": {"quota": 8, "kept": 8}, "prose": {"quota": 8, "kept": 0}, "code": {"quota": 8, "kept": 3}}}


def decision(failed, blocking=(), promote=False):
    return {"promote": promote, "failed_checks": list(failed), "blocking_slices": list(blocking)}


def test_a_slice_only_rejection_boosts_the_blocking_slices_that_have_traffic():
    plan = plan_retry(decision(["slice"], ["code", "prose"]), REPLAY, {"chat": 2.0}, 3.0)
    assert plan.boost == {"chat": 2.0, "code": 3.0}  # prose has nothing to replay: not boosted
    again = plan_retry(decision(["slice"], ["code"]), REPLAY, plan.boost, 3.0)
    assert again.boost == {"chat": 2.0, "code": 9.0}  # boosts compound over attempts


def test_no_retry_when_another_check_failed_or_nothing_can_be_replayed():
    assert plan_retry(decision(["gain", "slice"], ["code"]), REPLAY, {}, 3.0).boost is None
    assert plan_retry(decision(["lossless"]), REPLAY, {}, 3.0).boost is None
    assert plan_retry(decision([], promote=True), REPLAY, {}, 3.0).boost is None
    stuck = plan_retry(decision(["slice"], ["prose"]), REPLAY, {}, 3.0)
    assert stuck.boost is None and "prose have no replay samples" in stuck.reason


def test_a_slice_with_nothing_to_replay_is_retried_with_more_rehearsal_where_the_trainer_rehearses():
    only_prose = plan_retry(decision(["slice"], ["prose"]), REPLAY, {}, 3.0, rehearsal=2.0)
    assert only_prose.boost == {} and only_prose.rehearsal == 6.0
    assert "rehearsal x3 (rehearsal_ratio 2 -> 6) for prose" in only_prose.reason
    both = plan_retry(decision(["slice"], ["code", "prose"]), REPLAY, {}, 3.0, rehearsal=2.0)
    assert both.boost == {"code": 3.0} and both.rehearsal == 6.0  # each slice gets the lever it has
    replayable = plan_retry(decision(["slice"], ["code"]), REPLAY, {}, 3.0, rehearsal=2.0)
    assert replayable.boost == {"code": 3.0} and replayable.rehearsal == 2.0  # logged traffic: replay, not rehearsal
    unchanged = plan_retry(decision(["gain", "slice"], ["prose"]), REPLAY, {}, 3.0, rehearsal=2.0)
    assert unchanged.boost is None  # another check failed: no lever helps


def test_the_report_says_what_blocked_and_what_was_tried():
    attempts = [{"attempt": 1, "replay_boost": {}, "challenger_version": "4", "decision": decision(["slice"], ["code"]),
                 "next": "retry: slice regression on code: replay x3 of code"},
                {"attempt": 2, "replay_boost": {"code": 3.0}, "rehearsal": 6.0, "challenger_version": "5",
                 "decision": decision(["slice"], ["code"]), "next": "stop: max_retries reached"}]
    report = attempts_report(attempts)
    assert report["blocking_slices"] == ["code"]
    assert report["tried"] == [
        "attempt 1: default replay share -> v4 rejected (slice; blocking code); retry: slice regression on code: "
        "replay x3 of code",
        "attempt 2: code x3, rehearsal_ratio 6 -> v5 rejected (slice; blocking code); stop: max_retries reached"]


def test_served_slices_are_the_canary_sets(tmp_path):
    assert served_slices(ShadowConfig()) == ["chat", "code", "prose"]  # configs/canary.jsonl
    assert served_slices(ShadowConfig(include_canary=False)) == []
    canary = Path(tmp_path / "c.jsonl")
    canary.write_text('{"id": "a", "prompt": "p", "slice": "legal", "max_new_tokens": 8}\n')
    assert served_slices(ShadowConfig(canary_path=str(canary))) == ["legal"]


def test_the_rehearsal_lever_is_the_built_in_eagle_trainers_rehearsal_ratio():
    from draftwheel.flows.flywheel import FlywheelConfig, _rehearsal_ratio

    assert _rehearsal_ratio(FlywheelConfig(trainer="eagle")) == 2.0  # configs/eagle.yaml
    assert _rehearsal_ratio(FlywheelConfig(trainer="eagle", train_overrides=["rehearsal_ratio=0.5"])) == 0.5
    assert _rehearsal_ratio(FlywheelConfig(trainer="eagle", train_overrides=["rehearsal_ratio=0"])) is None
    assert _rehearsal_ratio(FlywheelConfig(trainer="eagle", train_overrides=["rehearsal="])) is None
    assert _rehearsal_ratio(FlywheelConfig(trainer="distill")) is None  # no rehearsal: the lever does not exist
    assert _rehearsal_ratio(FlywheelConfig(trainer="tests.flows.toy_trainers:copy_model")) is None
