"""benchmarks/bench_suffix.py on tiny random models: every method runs on both workloads, greedy output
of every engine mode equals plain decoding (the suffix tier is lossless), the index is built from the
logged requests and measured at scale."""

from __future__ import annotations


def test_help(load_benchmark, help_text):
    assert "--index-requests" in help_text(load_benchmark("bench_suffix"))


def test_tiny_run(load_benchmark, home, tmp_path):
    bench = load_benchmark("bench_suffix")
    out = tmp_path / "suffix.json"
    result = bench.main(["--model", "tiny", "--log-requests", "4", "--measure", "2", "--chat", "1",
                         "--max-new-tokens", "12", "--index-requests", "200", "--temperatures", "0",
                         "--out", str(out), "--no-tracking"])
    assert result["logged_requests"] == 4 and out.is_file()
    for workload, n in (("repetitive_t0.0", 2), ("chat_t0.0", 1)):
        figures = result[workload]
        assert figures["prompts"] == n
        assert {m: figures["greedy_identical"][m] for m in bench.METHODS} == dict.fromkeys(bench.METHODS, f"{n}/{n}")
        assert all(figures[f"{m}_tokens_per_s"] > 0 for m in bench.METHODS)
    scale = result["index_scale"]
    assert scale["logged_requests"] == 200 and scale["kept_requests"] > 0 and scale["propose_us_mean"] > 0
