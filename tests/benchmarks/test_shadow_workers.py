"""benchmarks/shadow_workers.py on toy models: the command replays twice and reports both replays' times
and whether they agree. Greedy replays of the draft alone are deterministic, so the same replay twice
must agree (as served, each run times the cost model's constants again); spawning real workers, by
request and by slice, is tested in tests/evaluation/test_shadow.py."""

from __future__ import annotations

from datasets import Dataset
from transformers import AutoTokenizer

from draftwheel.serving.testing import tiny_pair


def test_help(load_benchmark, help_text):
    text = help_text(load_benchmark("shadow_workers"))
    assert "--workers-first" in text and "--draft-alone" in text


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
                         "--holdout", str(tmp_path / "holdout"), "--workers", "1", "--draft-alone", "--no-tracking",
                         "--set", "include_canary=false", "--set", "bootstrap_resamples=100"])
    assert result["requests"] == result["requests_identical"] == 3
    assert result["figures_identical"] and result["verdict_identical"]
    assert result["replay_s_one_process"] > 0 and (home / "benchmarks" / "shadow_workers.json").is_file()
