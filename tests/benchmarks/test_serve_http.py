"""benchmarks/serve_http.py's measurements against a server in this process (the command itself starts
`draftwheel serve` in its own process, which takes longer than a smoke test should): the three paths
give the same greedy outputs, every request the server decoded is matched to its logged record, and the
sink's batched fsync is measured."""

from __future__ import annotations

import json


from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.server.app import ServeConfig, background_server, create_app
from draftwheel.serving.engine.sink import JsonlSink
from draftwheel.serving.testing import tiny_pair


def test_help(load_benchmark, help_text):
    assert "--pair" in help_text(load_benchmark("serve_http"))


def test_paths_agree_and_the_overheads_match_the_servers_records(load_benchmark, tmp_path):
    bench = load_benchmark("serve_http")
    target, draft = tiny_pair(tmp_path / "pair")
    prompts = bench.PROMPTS[:2]
    sink = JsonlSink(tmp_path / "logs")
    served = engine_from_specs(target, draft, sink=sink)
    config = ServeConfig(served_model_name="toy", suffix_tier=False, default_temperature=0.0)
    with background_server(create_app(served, config)) as url:
        result = bench.measure_paths(engine_from_specs(target, draft), url, prompts, max_new_tokens=6, rounds=1)
    sink.close()
    assert result["identical_outputs"] == "2/2" and result["concurrent_completed"] == "2/2"
    assert result["http_tokens_per_s"] > 0 and result["http_stream_tokens_per_s"] > 0
    # 2 warm-ups, 2 prompts x 2 paths sequentially, then 2 concurrent requests: the sequential ones come first.
    records = [json.loads(line) for line in (tmp_path / "logs" / "acceptance.jsonl").read_text().splitlines()]
    walls = result.pop("_http_walls")
    assert len(walls) == 6 and len(records) == 8
    overheads = bench.http_overheads(walls, records)
    assert set(overheads) == {"http_overhead_ms_median", "http_stream_overhead_ms_median", "server_median_latency_s"}
    rates = bench.measure_sink(json.dumps(records[-1]), n=20, where=tmp_path)
    assert rates["sink_records_per_s_fsync_each"] > 0 and rates["fsync_batching_speedup"] > 0

