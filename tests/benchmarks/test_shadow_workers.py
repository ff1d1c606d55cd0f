"""benchmarks/shadow_workers.py on toy models: the command replays the draft alone (the only replay that
workers share out) and reports both replays' times and whether they agree. Greedy replays are
deterministic, so the same replay twice must agree; spawning real workers is tested in
tests/evaluation/test_shadow.py."""

from __future__ import annotations

from datasets import Dataset
from transformers import AutoTokenizer

from draftwheel.serving.testing import tiny_pair


def test_help(load_benchmark, help_text):
    assert "--workers-first" in help_text(load_benchmark("shadow_workers"))


def test_two_replays_agree(load_benchmark, home, tmp_path):
    bench = load_benchmark("shadow_workers")
    target, draft = tiny_pair(tmp_path / "pair")
    tokenizer = AutoTokenizer.from_pretrained(target)
    rows = [{"request_id": f"h{i}", "slice": "code", "max_new_tokens": 6, "prompt_token_ids": [1],
             "output_token_ids": [2], "prompt": tokenizer.apply_chat_template(
                 [{"role": "user", "content": f"def f{i}(x): return"}], add_generation_prompt=True, tokenize=False)}
            for i in range(3)]
    Dataset.from_list(rows).save_to_disk(tmp_path / "holdout")
    result = bench.main(["--champion", str(draft), "--challenger", str(draft), "--target", str(target),
                         "--holdout", str(tmp_path / "holdout"), "--workers", "1", "--no-tracking",
                         "--set", "include_canary=false", "--set", "bootstrap_resamples=100"])
    assert result["requests"] == 3 and result["figures_identical"] and result["verdict_identical"]
    assert result["replay_s_one_process"] > 0 and (home / "benchmarks" / "shadow_workers.json").is_file()
