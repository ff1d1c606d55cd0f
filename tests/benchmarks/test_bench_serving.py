"""benchmarks/bench_serving.py on pair a at toy size: the constructed pair accepts every drafted token
(its target is the draft plus layers that add nothing), so the run must report acceptance 1, close to
k + 1 tokens per drafting step (the prompt's step, a prefill recorded as a step of k = 0, emits one, and a
request's last step, cut by max_new_tokens, fewer: 8 tokens at k = 2 are 1, 3, 3 and 1) and greedy output
identical to HF generate; the timings themselves are not checked."""

from __future__ import annotations

import json


def test_help(load_benchmark, help_text):
    assert "--pair" in help_text(load_benchmark("bench_serving"))


def test_pair_a_at_toy_size(load_benchmark, home):
    bench = load_benchmark("bench_serving")
    result = bench.main(["--pair", "a", "--hidden", "64", "--k", "2", "--max-new-tokens", "8", "--n-prompts", "2",
                         "--no-tracking"])
    assert result["acceptance_rate"] == 1.0 and 1.9 < result["mean_accepted_length"] <= 3.0
    assert result["greedy_identical"] == "2/2" and result["prompts"] == 2
    assert result["measured_c"] > 0 and result["theoretical_speedup"] > 1.0
    saved = json.loads((home / "benchmarks" / "bench_serving_a.json").read_text())
    assert saved["pair"] == "a" and saved["speedup_vs_plain"] == result["speedup_vs_plain"]
