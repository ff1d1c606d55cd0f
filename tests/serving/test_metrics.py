"""Metrics: `observe(record)` moves exactly the counters design.md names, by the amounts the record implies."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from draftwheel.serving.server.metrics import EXPORTED_NAMES, Metrics
from draftwheel.serving.engine.records import AcceptanceRecord, ModelId, Sampling, Step


def make_record(steps: list[tuple[int, int]], n_out: int | None = None, mode: str = "draft",
                latency_s: float = 0.2, ttft_s: float = 0.05, request_id: str = "r") -> AcceptanceRecord:
    """A valid record whose verification steps are `(k, accepted)` pairs (draft/target tokens are dummies)."""
    step_objs = [Step(k=k, accepted=a, draft_token_ids=list(range(k)), target_token_id=7) for k, a in steps]
    emitted = sum(a + 1 for _, a in steps)
    n_out = emitted if n_out is None else n_out
    return AcceptanceRecord(
        request_id=request_id, ts=time.time(), slice="test", target_id=ModelId("t", "1", "ab"),
        draft_id=ModelId("d", "2", "cd") if mode != "autoregressive" else None, mode=mode,
        sampling=Sampling(), prompt="hi", prompt_token_ids=[1, 2], output="x" * n_out,
        output_token_ids=list(range(n_out)), finish_reason="length", steps=step_objs,
        drafted_tokens=sum(k for k, _ in steps), accepted_tokens=sum(a for _, a in steps),
        verify_steps=len(steps), ttft_s=ttft_s, latency_s=latency_s,
    )


def test_observe_counts_drafts_tokens_positions_and_rollback():
    metrics = Metrics()
    metrics.observe(make_record([(4, 4), (4, 1), (3, 0)]))
    assert metrics.value("draftwheel_spec_drafts_total") == 3
    assert metrics.value("draftwheel_spec_draft_tokens_total") == 11
    assert metrics.value("draftwheel_spec_accepted_tokens_total") == 5
    per_pos = {p: metrics.value("draftwheel_spec_accepted_tokens_per_pos_total", {"position": str(p)})
               for p in range(5)}
    # positions 0..3 from the first step, position 0 again from the second.
    assert per_pos == {0: 2, 1: 1, 2: 1, 3: 1, 4: 0}
    # rollback depths 0, 3, 3
    assert metrics.value("draftwheel_spec_rollback_depth_count") == 3
    assert metrics.value("draftwheel_spec_rollback_depth_sum") == 6
    assert metrics.value("draftwheel_spec_rollback_depth_bucket", {"le": "0.0"}) == 1
    assert metrics.value("draftwheel_spec_rollback_depth_bucket", {"le": "2.0"}) == 1
    assert metrics.value("draftwheel_spec_rollback_depth_bucket", {"le": "3.0"}) == 3
    assert metrics.value("draftwheel_generated_tokens_total") == 8
    assert metrics.value("draftwheel_request_latency_seconds_count") == 1
    assert metrics.value("draftwheel_request_latency_seconds_sum") == 0.2
    assert metrics.value("draftwheel_ttft_seconds_sum") == 0.05
    assert metrics.value("draftwheel_requests_total", {"mode": "draft", "finish_reason": "length"}) == 1


def test_autoregressive_record_moves_no_speculative_counter():
    metrics = Metrics()
    metrics.observe(make_record([], n_out=5, mode="autoregressive"))
    assert metrics.value("draftwheel_spec_drafts_total") == 0
    assert metrics.value("draftwheel_spec_rollback_depth_count") == 0
    assert metrics.value("draftwheel_generated_tokens_total") == 5


def test_empty_output_records_latency_but_no_ttft():
    metrics = Metrics()
    metrics.observe(make_record([], n_out=0, mode="autoregressive"))
    assert metrics.value("draftwheel_request_latency_seconds_count") == 1
    assert metrics.value("draftwheel_ttft_seconds_count") == 0


def test_each_metrics_has_its_own_registry():
    first, second = Metrics(), Metrics()  # would raise "Duplicated timeseries" on a shared registry
    first.observe(make_record([(2, 2)]))
    assert first.value("draftwheel_spec_drafts_total") == 1
    assert second.value("draftwheel_spec_drafts_total") == 0


def test_render_exposes_exactly_the_documented_names():
    metrics = Metrics()
    metrics.observe(make_record([(2, 1)]))
    metrics.log_write_errors.inc()
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    exposed = set()
    for family in families.values():
        for sample in family.samples:
            base = sample.name
            for suffix in ("_bucket", "_count", "_sum", "_created"):
                if family.type == "histogram" and base.endswith(suffix):
                    base = base[: -len(suffix)]
            if not base.endswith("_created"):
                exposed.add(base)
    assert exposed == set(EXPORTED_NAMES)
    assert "draftwheel_log_write_errors_total 1.0" in metrics.render().decode()


def test_tpot_queue_time_and_batch_histograms():
    metrics = Metrics()
    metrics.observe(make_record([(2, 1), (2, 2)], latency_s=0.5, ttft_s=0.1))  # 5 tokens: (0.5 - 0.1) / 4
    metrics.observe(make_record([], n_out=1, mode="autoregressive"))  # one token: no time per output token
    assert metrics.value("draftwheel_tpot_seconds_count") == 1
    assert abs(metrics.value("draftwheel_tpot_seconds_sum") - 0.1) < 1e-9
    metrics.observe_step(rows=12, tokens=40)
    metrics.observe_queue(0.3)
    assert metrics.value("draftwheel_batch_rows_bucket", {"le": "12.0"}) == 1
    assert metrics.value("draftwheel_batch_rows_bucket", {"le": "8.0"}) == 0
    assert metrics.value("draftwheel_batch_tokens_sum") == 40
    assert metrics.value("draftwheel_queue_time_seconds_sum") == 0.3
