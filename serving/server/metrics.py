"""Prometheus metrics of the serving engine, named as in design.md, in a registry of their own.

`Metrics.observe(record)` turns one finished request's `AcceptanceRecord` into counter and histogram
updates; `Metrics.render()` gives the text exposition served on `/metrics`. Each `Metrics` owns its
`CollectorRegistry`, so several engines (and tests) in one process never collide.

Speculative counters follow vLLM's definitions: one "draft" per verification step, `k` draft tokens
per step, per-position acceptance counted for positions `0..accepted-1` of each step. The rollback
depth of a step is `k - accepted` (drafted tokens thrown away and rolled back in the KV caches).
The speculative metrics carry a `source` label: the step's `source` (what drafted it), else the mode.

Not here: alert thresholds (configs/prometheus/alerts.yml), writing logs (draftwheel.serving.engine.sink).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from draftwheel.serving.engine.records import AcceptanceRecord

# Rollback depth is an integer 0..k; integer buckets make histogram_quantile exact at the alert's 3.
ROLLBACK_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 12, 16)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_ROW_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128)
BATCH_TOKEN_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)

# The metric names the alert rules and dashboards may rely on (Prometheus exposition names).
EXPORTED_NAMES = (
    "draftwheel_spec_drafts_total",
    "draftwheel_spec_draft_tokens_total",
    "draftwheel_spec_accepted_tokens_total",
    "draftwheel_spec_accepted_tokens_per_pos_total",
    "draftwheel_spec_rollback_depth",
    "draftwheel_request_latency_seconds",
    "draftwheel_ttft_seconds",
    "draftwheel_generated_tokens_total",
    "draftwheel_requests_total",
    "draftwheel_log_write_errors_total",
    "draftwheel_queue_depth",
    "draftwheel_tpot_seconds",
    "draftwheel_queue_time_seconds",
    "draftwheel_batch_rows",
    "draftwheel_batch_tokens",
    "draftwheel_prefix_cache_queries_total",
    "draftwheel_prefix_cache_hits_total",
)


class Metrics:
    """The engine's Prometheus metrics; thread-safe (prometheus_client locks each sample)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.drafts = Counter("draftwheel_spec_drafts", "Speculative verification steps (one draft each).",
                              ["source"], registry=reg)
        self.draft_tokens = Counter("draftwheel_spec_draft_tokens", "Tokens proposed by the draft.", ["source"],
                                    registry=reg)
        self.accepted_tokens = Counter("draftwheel_spec_accepted_tokens", "Draft tokens accepted by the target.",
                                       ["source"], registry=reg)
        self.accepted_per_pos = Counter(
            "draftwheel_spec_accepted_tokens_per_pos", "Accepted draft tokens by position within the draft (0-based).",
            ["source", "position"], registry=reg)
        self.rollback_depth = Histogram(
            "draftwheel_spec_rollback_depth", "Per verification step: drafted minus accepted tokens (k - accepted).",
            ["source"], buckets=ROLLBACK_BUCKETS, registry=reg)
        self.request_latency = Histogram(
            "draftwheel_request_latency_seconds", "Time from request start to its last token.",
            buckets=LATENCY_BUCKETS, registry=reg)
        self.ttft = Histogram("draftwheel_ttft_seconds", "Time to first generated token.", buckets=TTFT_BUCKETS,
                              registry=reg)
        self.generated_tokens = Counter("draftwheel_generated_tokens", "Tokens generated (output tokens).",
                                        registry=reg)
        self.requests = Counter("draftwheel_requests", "Finished requests.", ["mode", "finish_reason"],
                                registry=reg)
        self.log_write_errors = Counter("draftwheel_log_write_errors",
                                        "Acceptance records that could not be written to the log.", registry=reg)
        self.queue_depth = Gauge("draftwheel_queue_depth", "HTTP requests waiting for or holding the engine.",
                                 registry=reg)
        self.tpot = Histogram("draftwheel_tpot_seconds", "Time per output token after the first, per request.",
                              buckets=TPOT_BUCKETS, registry=reg)
        self.queue_time = Histogram("draftwheel_queue_time_seconds",
                                    "Batched scheduler: time from arrival to joining the running batch.",
                                    buckets=QUEUE_BUCKETS, registry=reg)
        self.batch_rows = Histogram("draftwheel_batch_rows", "Batched scheduler: requests in each target forward.",
                                    buckets=BATCH_ROW_BUCKETS, registry=reg)
        self.prefix_queries = Counter("draftwheel_prefix_cache_queries",
                                      "Batched scheduler with prefix caching: prompt tokens looked up.", registry=reg)
        self.prefix_hits = Counter("draftwheel_prefix_cache_hits",
                                   "Batched scheduler with prefix caching: prompt tokens found computed.", registry=reg)
        self.batch_tokens = Histogram("draftwheel_batch_tokens", "Batched scheduler: tokens in each target forward.",
                                      buckets=BATCH_TOKEN_BUCKETS, registry=reg)

    def observe(self, record: AcceptanceRecord) -> None:
        """Account one finished request."""
        self.requests.labels(mode=record.mode, finish_reason=record.finish_reason).inc()
        self.generated_tokens.inc(len(record.output_token_ids))
        self.request_latency.observe(record.latency_s)
        if record.output_token_ids:
            self.ttft.observe(record.ttft_s)
        if len(record.output_token_ids) > 1:
            self.tpot.observe((record.latency_s - record.ttft_s) / (len(record.output_token_ids) - 1))
        for step in record.steps:
            source = step.source or record.mode
            self.drafts.labels(source=source).inc()
            self.draft_tokens.labels(source=source).inc(step.k)
            self.accepted_tokens.labels(source=source).inc(step.accepted)
            for position in range(step.accepted):
                self.accepted_per_pos.labels(source=source, position=str(position)).inc()
            self.rollback_depth.labels(source=source).observe(step.k - step.accepted)

    def observe_step(self, rows: int, tokens: int) -> None:
        """One batched target forward (draftwheel.serving.engine.batching calls it)."""
        self.batch_rows.observe(rows)
        self.batch_tokens.observe(tokens)

    def observe_queue(self, seconds: float) -> None:
        """A request joined the running batch after waiting `seconds`."""
        self.queue_time.observe(seconds)

    def observe_prefix(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A request joined the batch with `cached_tokens` of its prompt in shared blocks."""
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(cached_tokens)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of the exposed samples named `name` whose labels include `labels` (0.0 if none), e.g. a
        counter over all sources; for tests and health reports."""
        wanted = (labels or {}).items()
        return sum(sample.value for metric in self.registry.collect() for sample in metric.samples
                   if sample.name == name and wanted <= sample.labels.items())
