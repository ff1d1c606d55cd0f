"""The retry policy as plain functions: when a rejected turn is retried, with which replay boost, and the report."""

from __future__ import annotations

from pathlib import Path

from flows.replay import attempts_report, plan_retry, served_slices
from serving.shadow import ShadowConfig

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
    assert stuck.boost is None and "prose have no earlier traffic" in stuck.reason


def test_the_report_says_what_blocked_and_what_was_tried():
    attempts = [{"attempt": 1, "replay_boost": {}, "challenger_version": "4", "decision": decision(["slice"], ["code"]),
                 "next": "retry: slice regression on code: replay x3 of code"},
                {"attempt": 2, "replay_boost": {"code": 3.0}, "challenger_version": "5",
                 "decision": decision(["slice"], ["code"]), "next": "stop: max_retries reached"}]
    report = attempts_report(attempts)
    assert report["blocking_slices"] == ["code"]
    assert report["tried"] == [
        "attempt 1: default replay share -> v4 rejected (slice; blocking code); retry: slice regression on code: "
        "replay x3 of code",
        "attempt 2: code x3 -> v5 rejected (slice; blocking code); stop: max_retries reached"]


def test_served_slices_are_the_canary_sets(tmp_path):
    assert served_slices(ShadowConfig()) == ["chat", "code", "prose"]  # configs/canary.jsonl
    assert served_slices(ShadowConfig(include_canary=False)) == []
    canary = Path(tmp_path / "c.jsonl")
    canary.write_text('{"id": "a", "prompt": "p", "slice": "legal", "max_new_tokens": 8}\n')
    assert served_slices(ShadowConfig(canary_path=str(canary))) == ["legal"]
