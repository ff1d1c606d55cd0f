"""benchmarks/bench_distill.py on a toy target: the small-LM v0 is bootstrapped into its own dir and not
registered (a benchmark must not move the state dir's champion), one distillation round runs on the
target's code completions, and the report carries acceptance before and after on both hold-outs."""

from __future__ import annotations

import json
from pathlib import Path

from draftwheel.serving.testing import tiny_pair


def test_help(load_benchmark, help_text):
    text = help_text(load_benchmark("bench_distill"))
    assert "--boot" in text and "draft_kind=lm" in text


def test_one_round_on_a_toy_target(load_benchmark, home, tmp_path):
    bench = load_benchmark("bench_distill")
    target, _ = tiny_pair(tmp_path / "pair", target_layers=3)
    boot = ["target=" + str(target), "n_prompts=4", "holdout_prompts=2", "epochs=1", "tracking=false"]
    report = bench.main([*(f"--boot={b}" for b in boot), "--chat-holdout", "2", "--code-holdout", "2",
                         "--code-train", "4", "--max-new-tokens", "8", "--timing-steps", "1", "--no-tracking",
                         "tracking=false"])
    v0 = Path(report["v0_draft"])  # bootstrap keeps a v0 per target: the name ends in the target's weights hash
    assert v0.parent == home / "models" and v0.name.startswith("bench-distill-v0-lm-") and v0.is_dir()
    assert {report[key]["requests"] for key in ("v0_chat", "v0_code", "after_chat", "after_code")} == {2}
    assert set(report["teacher_modes"]) == {"online", "cached_from_generation", "cached_by_forward"}
    assert report["train"]["steps"] > 0 and "code_mean_accepted_length_gain" in report
    assert json.loads((home / "benchmarks" / "bench_distill.json").read_text())["k"] == 4
    assert not (home / "mlflow.db").exists()  # nothing registered, nothing tracked
