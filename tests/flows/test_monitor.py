"""Monitor trigger logic as plain functions: windows, thresholds, evidence, target hash, log reading."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from draftwheel.config import ConfigError, load_config
from draftwheel.flows.monitor import MonitorConfig, acceptance_by_slice, decide, read_records, window, windows
from draftwheel.serving.engine.records import AcceptanceRecord, ModelId, Sampling, Step

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CHAMPION = "c" * 64


def record(ts: float, slice: str, accepted: int, drafted: int = 10, mode: str = "draft",
           draft_sha: str = CHAMPION) -> AcceptanceRecord:
    # One step with the given counts, so the totals agree with the steps as parse_record requires.
    steps = [Step(k=drafted, accepted=accepted, draft_token_ids=[1] * drafted, target_token_id=2)] if mode == "draft" else []
    return AcceptanceRecord(
        request_id=f"r{ts}", ts=ts, slice=slice, target_id=ModelId("t", sha256="t" * 64),
        draft_id=ModelId("d", "1", draft_sha) if mode == "draft" else None, mode=mode, sampling=Sampling(),
        prompt="p", prompt_token_ids=[1], output="o", output_token_ids=[2], finish_reason="length", steps=steps,
        drafted_tokens=sum(s.k for s in steps), accepted_tokens=sum(s.accepted for s in steps), verify_steps=len(steps),
    )


def config(**kw) -> MonitorConfig:
    base = dict(window_requests=20, min_requests=4, min_acceptance=0.5, check_target_sha=True)
    return MonitorConfig(**{**base, **kw})


def test_healthy_traffic_does_not_trigger():
    records = [record(i, "chat", accepted=8) for i in range(10)]
    decision = decide(window(records, config(), now=100), config())
    assert not decision.trigger and decision.reasons == []
    assert decision.stats["overall"].acceptance_rate == pytest.approx(0.8)


def test_low_overall_acceptance_triggers():
    records = [record(i, "chat", accepted=2) for i in range(10)]
    decision = decide(window(records, config(), now=100), config())
    assert decision.trigger
    assert "0.200 < 0.5 on overall" in decision.reasons[0]


def test_one_slice_dropping_triggers_even_when_overall_is_fine():
    # 16 chat requests at 0.9 and 4 code requests at 0.1: overall 0.74, code alone 0.1.
    records = [record(i, "chat", accepted=9) for i in range(16)]
    records += [record(20 + i, "code", accepted=1) for i in range(4)]
    decision = decide(window(records, config(), now=100), config())
    assert decision.stats["overall"].acceptance_rate == pytest.approx(0.74)
    assert decision.trigger and len(decision.reasons) == 1 and "on code" in decision.reasons[0]
    assert not decide(records, config(per_slice=False)).trigger


def test_slice_threshold_overrides_the_default():
    records = [record(i, "code", accepted=4) for i in range(8)]
    assert decide(records, config()).trigger  # 0.4 < 0.5
    assert not decide(records, config(min_acceptance=0.5, slice_min_acceptance={"code": 0.3,
                                                                                   "overall": 0.3})).trigger


def test_too_few_requests_is_not_evidence():
    records = [record(i, "code", accepted=0) for i in range(3)]
    assert not decide(records, config(min_requests=4)).trigger


def test_window_keeps_the_most_recent_drafted_requests_only():
    old_bad = [record(i, "code", accepted=0) for i in range(30)]
    new_good = [record(100 + i, "code", accepted=9) for i in range(20)]
    plain = [record(200 + i, "code", accepted=0, mode="autoregressive") for i in range(5)]
    kept = window(old_bad + new_good + plain, config(window_requests=20), now=300)
    assert [r.ts for r in kept] == [100 + i for i in range(20)]
    assert not decide(kept, config()).trigger


def test_window_by_age_and_by_champion():
    records = [record(i, "chat", accepted=0) for i in range(10)]
    records += [record(95 + i, "chat", accepted=9) for i in range(5)]
    assert [r.ts for r in window(records, config(window_seconds=10), now=105)] == [95, 96, 97, 98, 99]
    other = [record(200 + i, "chat", accepted=0, draft_sha="o" * 64) for i in range(5)]
    kept = window(records + other, config(), now=300, champion_sha=CHAMPION)
    assert all(r.draft_id.sha256 == CHAMPION for r in kept) and len(kept) == 15
    assert len(window(records + other, config(champion_only=False), now=300, champion_sha=CHAMPION)) == 20


def test_target_hash_change_triggers_without_any_traffic():
    decision = decide([], config(), target_sha="a" * 64, champion_target_sha="b" * 64)
    assert decision.trigger and "target weights changed" in decision.reasons[0]
    assert not decide([], config(), target_sha="a" * 64, champion_target_sha="a" * 64).trigger
    assert not decide([], config(check_target_sha=False), target_sha="a" * 64, champion_target_sha="b" * 64).trigger
    assert not decide([], config(), target_sha="a" * 64, champion_target_sha=None).trigger  # untagged champion


def test_acceptance_is_token_weighted():
    stats = acceptance_by_slice([record(0, "x", accepted=10, drafted=10), record(1, "x", accepted=0, drafted=30)])
    assert stats["x"].acceptance_rate == pytest.approx(0.25) and stats["x"].requests == 2


def test_read_records_skips_bad_lines(tmp_path):
    good = [record(i, "chat", accepted=5) for i in range(3)]
    lines = [good[0].to_json(), "{not json", good[1].to_json(), '{"schema_version": 99}', good[2].to_json()[:40],
             good[2].to_json()]
    (tmp_path / "acceptance.jsonl").write_text("\n".join(lines) + "\n")
    assert [r.request_id for r in read_records(tmp_path)] == [r.request_id for r in good]
    assert list(read_records(tmp_path / "missing")) == []


@pytest.mark.parametrize("override, field", [
    ("window_requests=0", "window_requests"), ("min_requests=100", "min_requests"),
    ("min_acceptance=1.5", "min_acceptance"), ("window_seconds=-1", "window_seconds"),
    ("retrigger_after_requests=-1", "retrigger_after_requests"),
])
def test_config_rejects_bad_values(override, field):
    with pytest.raises(ValueError, match=field):
        load_config(MonitorConfig, None, [override])


def test_slice_threshold_must_be_a_rate():
    with pytest.raises(ValueError, match="slice_min_acceptance.code"):
        MonitorConfig(slice_min_acceptance={"code": 2})


def test_shipped_monitor_config_loads():
    assert load_config(MonitorConfig, CONFIGS / "monitor.yaml") == MonitorConfig()
    with pytest.raises(ConfigError, match="windw"):
        load_config(MonitorConfig, CONFIGS / "monitor.yaml", ["windw=3"])


def served_by(version: str, slice: str, accepted: int, n: int) -> list[AcceptanceRecord]:
    """`n` one-step records of `slice` drafted by version `version` of draftwheel-draft."""
    rows = [record(i, slice, accepted=accepted) for i in range(n)]
    for row in rows:
        row.draft_id = ModelId("draftwheel-draft", version, "d" * 64)
    return rows


def test_delivered_gain_compares_the_champion_with_the_previous_champion_per_slice():
    from draftwheel.flows.served import VersionTally, delivered_gain, delivered_metrics

    records = (served_by("1", "code", 2, 4) + served_by("2", "code", 6, 4) + served_by("2", "chat", 5, 2)
               + served_by("3", "code", 9, 3) + [record(9, "code", 0, mode="autoregressive")])
    tally = VersionTally("draftwheel-draft", ["2", "1"])
    assert list(tally.watch(records)) == records  # passes everything through
    gain = delivered_gain(tally, "2", "1")
    code = gain["slices"]["code"]
    # one step of 10 drafts per request: MAL = (accepted + 1) / 1, acceptance = accepted / 10 (draftwheel.serving.engine.acceptance)
    assert code["champion"] == {"requests": 4, "acceptance_rate": 0.6, "mean_accepted_length": 7.0}
    assert code["previous"]["mean_accepted_length"] == 3.0 and code["mal_change"] == pytest.approx(7 / 3 - 1)
    assert gain["slices"]["chat"]["previous"] is None and gain["slices"]["chat"]["mal_change"] is None
    assert gain["slices"]["overall"]["champion"]["requests"] == 6  # version 3 and plain decoding not counted
    # every request of each arm is alike, so every resample is too: the interval is the point
    assert code["mal_change_ci"] == pytest.approx([7 / 3 - 1, 7 / 3 - 1]) and gain["slices"]["chat"]["mal_change_ci"] is None
    metrics = delivered_metrics(gain)
    assert metrics["delivered.code.mal_change"] == pytest.approx(7 / 3 - 1) and "delivered.chat.mal_change" not in metrics
    assert metrics["delivered.code.mal_change_low"] == pytest.approx(7 / 3 - 1)
    assert delivered_gain(VersionTally("draftwheel-draft", ["5"]), "5", None)["slices"] == {}


def hybrid(version: str, steps: list[tuple[str | None, int, int]], i: int = 0) -> AcceptanceRecord:
    """A code request served in mode hybrid by `version`: steps as (source, drafted, accepted)."""
    row = record(i, "code", 0)
    row.mode, row.draft_id = "hybrid", ModelId("draftwheel-draft", version, "d" * 64)
    row.steps = [Step(k=k, accepted=a, draft_token_ids=[1] * k, target_token_id=2, source=src) for src, k, a in steps]
    row.drafted_tokens, row.accepted_tokens = sum(k for _, k, _ in steps), sum(a for _, _, a in steps)
    row.verify_steps = len(steps)
    return row


def test_delivered_gain_as_served_counts_every_step_of_hybrid_requests():
    """The draft's own figure counts its steps; the user's speed comes from every step. In the hybrid
    the suffix index drafts most code steps, so a draft that doubled its own figure may move the request's
    little (a shifted-code round: +42 % on its own steps, +1-3 % as served)."""
    from draftwheel.flows.served import VersionTally, delivered_gain, delivered_metrics

    v1 = [hybrid("1", [("suffix", 4, 3), ("suffix", 4, 3), ("eagle3", 4, 0), (None, 0, 0)], i) for i in range(3)]
    v1.append(hybrid("1", [("suffix", 4, 3), (None, 0, 0)], 3))  # the draft drafted nothing: as served only
    v2 = [hybrid("2", [("suffix", 4, 3), ("suffix", 4, 3), ("eagle3", 4, 2), (None, 0, 0)], i) for i in range(4)]
    tally = VersionTally("draftwheel-draft", ["1", "2"])
    list(tally.watch(v1 + v2))
    gain = delivered_gain(tally, "2", "1")
    own, served = gain["slices"]["code"], gain["as_served"]["code"]
    # the draft's own steps (its eagle3 step; not the index's, nor the plain step): v1 (0 + 1) / 1, v2 (2 + 1) / 1
    assert own["previous"]["mean_accepted_length"] == 1.0 and own["champion"]["mean_accepted_length"] == 3.0
    assert own["previous"]["requests"] == 3 and own["mal_change"] == pytest.approx(2.0)
    # every step: v1 (3 * 6 + 3 + 3 * 4 + 2) / 14, v2 (4 * 8 + 16) / 16
    assert served["previous"]["requests"] == 4
    assert served["previous"]["mean_accepted_length"] == pytest.approx(35 / 14)
    assert served["champion"]["mean_accepted_length"] == pytest.approx(3.0)
    assert served["mal_change"] == pytest.approx(3.0 / (35 / 14) - 1)
    metrics = delivered_metrics(gain)
    assert metrics["delivered.code.mal_change"] == pytest.approx(2.0)
    assert metrics["delivered_as_served.code.mal_change"] == pytest.approx(served["mal_change"])


def test_delivered_as_served_equals_the_drafts_own_figure_in_draft_mode():
    from draftwheel.flows.served import VersionTally, delivered_gain

    tally = VersionTally("draftwheel-draft", ["1", "2"])
    list(tally.watch(served_by("1", "code", 2, 4) + served_by("2", "code", 6, 4)))
    gain = delivered_gain(tally, "2", "1")
    assert gain["as_served"]["code"] == gain["slices"]["code"]


def test_status_leads_with_the_as_served_figure_only_where_it_differs():
    import json

    from draftwheel.registry import _delivered_cell
    from draftwheel.flows.served import VersionTally, delivered_gain

    tally = VersionTally("draftwheel-draft", ["1", "2"])
    list(tally.watch([hybrid("1", [("suffix", 4, 3), ("eagle3", 4, 0)]), hybrid("2", [("suffix", 4, 3), ("eagle3", 4, 2)])]))
    cell = _delivered_cell(json.dumps(delivered_gain(tally, "2", "1")))
    assert cell == "code as served 3.50 +40% n=1 (draft alone 3.00 +200%)"
    tally = VersionTally("draftwheel-draft", ["1", "2"])
    list(tally.watch(served_by("1", "code", 2, 4) + served_by("2", "code", 6, 4)))
    assert "as served" not in _delivered_cell(json.dumps(delivered_gain(tally, "2", "1")))


def stats_of(accepted: list[int], slice: str = "code"):
    """A slice's stats over one-step requests that accepted these many tokens each."""
    from draftwheel.flows.served import SliceStats

    stats = SliceStats()
    for i, a in enumerate(accepted):
        stats.add(record(i, slice, a))
    return stats


def test_delivered_change_interval_separates_a_real_gain_from_sampling_noise():
    from draftwheel.flows.served import mal_change_interval

    rng = random.Random(0)
    before = stats_of([rng.choice([0, 0, 1, 2]) for _ in range(40)])  # MAL ~1.75
    same = stats_of([rng.choice([0, 0, 1, 2]) for _ in range(40)])  # another sample of the same draft
    better = stats_of([rng.choice([1, 2, 2, 3]) for _ in range(40)])  # MAL ~3
    low, high = mal_change_interval([(same, before)])
    point = same.mean_accepted_length / before.mean_accepted_length - 1
    assert low < 0 < high and low <= point <= high  # noise: the interval covers no change
    low, high = mal_change_interval([(better, before)])
    assert low > 0.2  # a real gain (~+70 %): the whole interval is well above zero
    # fewer requests, wider interval; a narrower confidence, narrower interval
    few_low, few_high = mal_change_interval([(stats_of(list(better.request_accepted)[:8]),
                                                   stats_of(list(before.request_accepted)[:8]))])
    assert few_high - few_low > high - low
    low80, high80 = mal_change_interval([(better, before)], confidence=0.8)
    assert low80 > low and high80 < high
    assert mal_change_interval([(better, before)]) == (low, high)  # seeded: a report is reproducible
    assert mal_change_interval([(stats_of([2]), before)]) is None  # one request: nothing to resample


def test_delivered_interval_subsamples_a_huge_arm_and_stays_bounded(monkeypatch):
    import draftwheel.flows.served as served

    monkeypatch.setattr(served, "MAX_RESAMPLED_REQUESTS", 50)
    big = stats_of([i % 3 for i in range(500)])
    low, high = served.mal_change_interval([(big, stats_of([i % 3 for i in range(7, 507)]))])
    assert low < 0 < high  # the same law: the subsampled interval still covers no change


def test_overall_delivered_change_compares_at_the_champions_mix_not_the_traffic_shift():
    # The previous champion served mostly chat (MAL 4) and some code (MAL 2); the champion serves only
    # code, at 2.5. Per slice: code +25 %. The raw overall ratio would read 2.5 / (a chat-heavy 3.7) - 1 < 0.
    from draftwheel.flows.served import VersionTally, delivered_gain

    tally = VersionTally("draftwheel-draft", ["2", "1"])
    list(tally.watch(served_by("1", "chat", 3, 30) + served_by("1", "code", 1, 4) + served_by("2", "code", 1, 2)
                     + served_by("2", "code", 2, 2) + served_by("2", "prose", 0, 3)))
    gain = delivered_gain(tally, "2", "1")
    overall, code = gain["slices"]["overall"], gain["slices"]["code"]
    assert code["mal_change"] == pytest.approx(2.5 / 2 - 1)
    assert overall["previous"]["mean_accepted_length"] > overall["champion"]["mean_accepted_length"]  # raw figures
    assert overall["compared_slices"] == ["code"]  # prose: the previous champion never served it
    assert overall["mal_change"] == pytest.approx(code["mal_change"])
    assert overall["mal_change_ci"] == pytest.approx(code["mal_change_ci"])  # one compared slice: the same interval
    assert overall["acceptance_change"] == pytest.approx(code["acceptance_change"])


def test_same_mix_change_weights_the_previous_figures_by_the_champions_steps():
    from draftwheel.flows.served import mal_change_interval, same_mix_change

    pairs = [(stats_of([2] * 6, "chat"), stats_of([1] * 5, "chat")),  # chat 3.0 vs 2.0
             (stats_of([1] * 2, "code"), stats_of([1] * 9, "code"))]  # code 2.0 vs 2.0
    # champion: 8 steps, (18 + 4) tokens = 2.75; previous at the champion's mix: (6 * 2 + 2 * 2) / 8 = 2.0
    assert same_mix_change(pairs) == pytest.approx(2.75 / 2.0 - 1)
    assert mal_change_interval(pairs) == pytest.approx((2.75 / 2.0 - 1,) * 2)  # constant requests: a point
    assert same_mix_change([(stats_of([], "chat"), stats_of([1], "chat"))]) is None


def test_delivered_confidence_must_be_a_proper_level():
    with pytest.raises(ValueError, match="delivered_confidence"):
        config(delivered_confidence=1.0)


def test_hybrid_requests_count_only_the_steps_the_draft_drafted():
    # With the suffix tier on, serving's default mode is hybrid: its index-drafted steps must neither hide
    # a failing draft nor make a request count as drafted.
    def hybrid(ts: float, suffix_accepted: int, draft_accepted: int | None) -> AcceptanceRecord:
        steps = [Step(k=8, accepted=suffix_accepted, draft_token_ids=[1] * 8, target_token_id=2, source="suffix")]
        if draft_accepted is not None:
            steps.append(Step(k=4, accepted=draft_accepted, draft_token_ids=[1] * 4, target_token_id=2, source="eagle3"))
        base = record(ts, "code", accepted=0)
        return AcceptanceRecord(**{**base.__dict__, "mode": "hybrid", "steps": steps,
                                   "drafted_tokens": sum(s.k for s in steps),
                                   "accepted_tokens": sum(s.accepted for s in steps), "verify_steps": len(steps)})

    failing_draft = [hybrid(i, suffix_accepted=8, draft_accepted=0) for i in range(10)]
    index_only = [hybrid(100 + i, suffix_accepted=8, draft_accepted=None) for i in range(5)]
    kept = window(failing_draft + index_only, config(), now=200)
    assert [r.ts for r in kept] == list(range(10))  # index-only requests say nothing about the draft
    stats = acceptance_by_slice(kept)["code"]
    assert (stats.drafted, stats.accepted, stats.steps) == (40, 0, 10)
    assert decide(kept, config()).trigger  # served acceptance 8/12 would have hidden it


def test_a_rejected_round_holds_the_trigger_until_enough_new_requests():
    records = [record(i, "code", accepted=1) for i in range(20)]
    cfg = config(retrigger_after_requests=8)
    recent = {"version": "3", "created": 15.5, "promote": False}  # 4 requests served since
    held = decide(window(records, cfg, now=100), cfg, rejection=recent)
    assert not held.trigger and held.reasons and "4 of 8 new requests" in held.held
    assert held.summary()["held"] == held.held
    older = {**recent, "created": 9.5}  # 10 since: new evidence
    assert decide(window(records, cfg, now=100), cfg, rejection=older).trigger
    capped = config(retrigger_after_requests=64)  # more than the window (20) can show: the window's size
    assert "4 of 20 new requests" in decide(window(records, capped, now=100), capped, rejection=recent).held
    no_hold = config(retrigger_after_requests=0)
    assert decide(window(records, no_hold, now=100), no_hold, rejection=recent).trigger


def test_requests_the_index_served_alone_count_as_new_traffic_after_a_rejected_round():
    """The hold waits for new traffic to mine, not for new drafted steps: on a slice the index now
    serves whole, requests with no draft step still end it."""
    def index_only(ts: float) -> AcceptanceRecord:
        steps = [Step(k=8, accepted=8, draft_token_ids=[1] * 8, target_token_id=2, source="suffix")]
        base = record(ts, "code", accepted=0)
        return AcceptanceRecord(**{**base.__dict__, "mode": "hybrid", "steps": steps, "drafted_tokens": 8,
                                   "accepted_tokens": 8, "verify_steps": 1})

    failing = [record(i, "code", accepted=0) for i in range(10)]
    cfg = config(retrigger_after_requests=8)
    rejection = {"version": "3", "created": 9.5, "promote": False}
    few = failing + [index_only(10 + i) for i in range(3)]
    drafted, served = windows(few, cfg, now=100)
    assert "3 of 8 new requests" in decide(drafted, cfg, rejection=rejection, served_records=served).held
    enough = failing + [index_only(10 + i) for i in range(8)]
    drafted, served = windows(enough, cfg, now=100)
    assert [r.ts for r in drafted] == list(range(10))  # none of the new requests says anything about the draft
    decision = decide(drafted, cfg, rejection=rejection, served_records=served)
    assert decision.trigger and not decision.held


def test_a_changed_target_triggers_even_after_a_rejected_round():
    records = [record(i, "code", accepted=1) for i in range(20)]
    cfg = config(retrigger_after_requests=8)
    decision = decide(window(records, cfg, now=100), cfg, target_sha="new", champion_target_sha="old",
                      rejection={"version": "3", "created": 19.5, "promote": False})
    assert decision.trigger and not decision.held


def test_monitor_prints_the_as_served_gain_of_hybrid_traffic(monkeypatch, capsys):
    from draftwheel import registry
    from draftwheel.flows.monitor import _delivered
    from draftwheel.flows.served import VersionTally

    stored = {}
    monkeypatch.setattr(registry, "record_delivered", lambda version, gain, name: stored.update({version: gain}))
    tally = VersionTally("draftwheel-draft", ["1", "2"])
    list(tally.watch([hybrid("1", [("suffix", 4, 3), ("eagle3", 4, 0)]), hybrid("2", [("suffix", 4, 3), ("eagle3", 4, 2)])]))
    gain = _delivered(config(tracking=False), tally, "2", "1", "draftwheel-draft")
    out = capsys.readouterr().out
    assert "delivered v2 code: mean accepted length 3.000 (+200.0% vs v1)" in out
    assert "delivered v2 code as served (every step, the suffix index's and plain ones too): mean accepted length 3.500 (+40.0% vs v1), n=1" in out
    assert stored["2"] is gain and gain["as_served"]["code"]["mal_change"] == pytest.approx(0.4)


def test_hybrid_requests_the_pace_served_with_plain_steps_count_for_their_slice():
    """Under serving's default mode a draft that fails on a slice is mostly not asked: the step pace takes
    plain steps and explores now and then. Those requests count in the window (their few drafted tokens
    decide the rate), so the monitor still sees the draft failing there; a slice with no drafted token
    at all says nothing about the draft and never triggers."""
    def hybrid(ts: float, explored: bool) -> AcceptanceRecord:
        plain = Step(k=0, accepted=0, draft_token_ids=[], target_token_id=2)
        steps = [plain] * 6 + ([Step(k=1, accepted=0, draft_token_ids=[1], target_token_id=2, source="eagle3")]
                               if explored else []) + [plain]
        base = record(ts, "code", accepted=0)
        return AcceptanceRecord(**{**base.__dict__, "mode": "hybrid", "steps": steps,
                                   "drafted_tokens": sum(s.k for s in steps), "accepted_tokens": 0,
                                   "verify_steps": len(steps)})

    records = [hybrid(i, explored=i % 5 == 0) for i in range(20)]
    kept = window(records, config(), now=100)
    assert len(kept) == 20 and acceptance_by_slice(kept)["code"].drafted == 4
    assert decide(kept, config()).trigger
    never = window([hybrid(i, explored=False) for i in range(20)], config(), now=100)
    assert len(never) == 20 and not decide(never, config()).trigger


def served_hybrid(ts: float, steps: list[tuple[str | None, int, int]], slice: str = "chat") -> AcceptanceRecord:
    """A champion's hybrid request: steps as (source, drafted, accepted)."""
    base = record(ts, slice, accepted=0)
    rows = [Step(k=k, accepted=a, draft_token_ids=[1] * k, target_token_id=2, source=src) for src, k, a in steps]
    return AcceptanceRecord(**{**base.__dict__, "mode": "hybrid", "steps": rows,
                               "drafted_tokens": sum(k for _, k, _ in steps),
                               "accepted_tokens": sum(a for _, _, a in steps), "verify_steps": len(rows)})


def test_the_as_served_window_keeps_requests_the_index_served_entirely():
    from draftwheel.flows.monitor import windows

    by_index = [served_hybrid(i, [("suffix", 4, 4)] * 3 + [(None, 0, 0)]) for i in range(6)]
    by_draft = [served_hybrid(10 + i, [("eagle3", 4, 3), (None, 0, 0)]) for i in range(4)]
    other = [record(20 + i, "chat", 3, draft_sha="e" * 64) for i in range(3)]  # an earlier champion's
    drafted, served = windows(by_index + by_draft + other, config(window_requests=8), now=100, champion_sha=CHAMPION)
    assert drafted == by_draft  # the draft's window: only what says something about the draft
    assert served == by_index[2:] + by_draft  # as served: the newest 8 of the champion's, whoever drafted


def test_slow_service_triggers_first_even_when_the_draft_accepts_well():
    """A slice served mostly by plain steps (the pace found the draft does not pay there) is slow for
    users: as served 10 tokens in 8 steps (1.25 < 1.3) triggers, and its reason comes first. The draft's
    own acceptance there, 2 of 2, would not."""
    steps = [(None, 0, 0)] * 6 + [("eagle3", 2, 2), (None, 0, 0)]
    records = [served_hybrid(i, steps) for i in range(8)]
    decision = decide(window(records, config(), now=100), config(), served_records=records)
    assert decision.trigger and decision.reasons[0].startswith("as served: mean accepted length 1.25 < 1.3 on overall")
    assert not any(reason.startswith("acceptance") for reason in decision.reasons)
    assert decision.summary()["served_mal"]["chat"] == pytest.approx(1.25)
    fast = [served_hybrid(i, [("suffix", 4, 3)] * 3 + [(None, 0, 0)]) for i in range(8)]
    assert not decide([], config(), served_records=fast).trigger  # 13 tokens in 4 steps
    assert not decide([], config(min_served_mal=0.0), served_records=records).trigger  # off
    assert decide([], config(slice_min_served_mal={"chat": 1.2}, per_slice=True, min_served_mal=1.0),
                  served_records=records).trigger is False  # 1.25 clears chat's own floor


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf")])
def test_served_floor_must_be_a_finite_non_negative_number(value):
    with pytest.raises(ValueError, match="min_served_mal"):
        config(min_served_mal=value)
    with pytest.raises(ValueError, match="slice_min_served_mal.chat"):
        config(slice_min_served_mal={"chat": value})


def test_the_demos_as_served_floor_never_sits_above_what_chat_delivers():
    """The demo's monitor floor as served: the monitor's own (1.3) where the champion's chat delivers
    more; 0.85 of what chat delivers where it delivers less (plain steps only here: 1.0 a step), so the
    same chat does not trigger it before the traffic shifts, while the monitor's own floor would."""
    from draftwheel.flows.demo import chat_served_floor

    assert chat_served_floor([record(i, "chat", accepted=8) for i in range(10)], 0.85) == MonitorConfig().min_served_mal
    weak = [record(i, "chat", accepted=0) for i in range(10)]
    floor = chat_served_floor(weak, 0.85)
    assert floor == pytest.approx(0.85)
    kept = config(min_acceptance=0.0, min_served_mal=floor)
    assert not decide(weak, kept, served_records=weak).trigger
    assert decide(weak, config(min_acceptance=0.0), served_records=weak).trigger
