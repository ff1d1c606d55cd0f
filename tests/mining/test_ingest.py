"""`draftwheel ingest`: request/response logs (vLLM's shape) -> records; bad lines quarantined; then mined.

Records from another engine carry text but no token ids and no steps: mining derives the ids from the
text with the target's tokenizer, and without one leaves those requests out, counted.
"""

from __future__ import annotations

import json
import random

import pytest
from datasets import load_from_disk
from transformers import AutoTokenizer

from draftwheel.flows.commands import main
from draftwheel.mining.ingest import ingest
from draftwheel.mining.pipeline import mine
from draftwheel.serving.engine.records import parse_record
from draftwheel.serving.engine.sink import iter_lines
from tests.mining.conftest import fast_config, write_lines
from tests.serving import vllm_fixtures as vllm

WORDS = "sea sky fox dog poem stack list items read write test class return import print line".split()


def exchanges(n: int) -> list[dict]:
    """`n` distinct exchanges a second apart (`created`: the records' time), alternating non-streamed
    completions and streamed chats, two slices."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(10))
        if i % 2:
            request = {"model": vllm.MODEL, "messages": [{"role": "user", "content": words}], "stream": True,
                       "slice": "chat"}
            response = [{**c, "created": vllm.CREATED + i} for c in vllm.chat_chunks((words[:20], words[20:]))]
        else:
            request = {"model": vllm.MODEL, "prompt": words, "metadata": {"slice": "code"}}
            response = {**vllm.completion(f"{words} and more"), "created": vllm.CREATED + i}
        rows.append({"request": request, "response": response})
    return rows


BAD = [
    "{not json\n",
    "[1, 2]\n",
    json.dumps({"request": {"model": "m", "prompt": "p"}}) + "\n",
    json.dumps({"request": {"model": "m", "prompt": "p"}, "response": {"error": {"message": "overloaded"}}}) + "\n",
    json.dumps({"request": {"model": "m", "prompt": "p", "n": 2}, "response": vllm.completion()}) + "\n",
    json.dumps({"request": {"model": "m", "prompt": "call 555-123-4567"},
                "response": {**vllm.completion(), "metrics": {"speculative_decoding": {"num_spec_steps": 2}}}}) + "\n",
]


@pytest.fixture
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def test_good_lines_become_records_and_bad_ones_are_quarantined(tmp_path, tokenizer):
    good = exchanges(4)
    path = write_lines(tmp_path / "traffic.jsonl", [good[0], BAD[0], good[1], "\n", *BAD[1:], *good[2:]])
    summary = ingest(path, tmp_path / "logs", tmp_path / "quarantine.jsonl", tokenizer)
    assert (summary["lines"], summary["records"], summary["blank"], summary["quarantined"]) == (11, 4, 1, 6)
    assert summary["quarantine_by_kind"] == {"not_json": 1, "not_an_object": 1, "missing_field": 1,
                                             "upstream_error": 1, "not_single_sequence": 1, "bad_metrics": 1}
    quarantined = [json.loads(line) for line in (tmp_path / "quarantine.jsonl").read_text().splitlines()]
    assert [q["line"] for q in quarantined] == [2, 5, 6, 7, 8, 9]  # positions, as mining's quarantine
    assert "555-123-4567" not in quarantined[-1]["text"]  # scrubbed like mining's
    records = [parse_record(line) for _, _, line in iter_lines(tmp_path / "logs")]
    assert [r.source for r in records] == ["ingest:traffic.jsonl"] * 4
    assert [r.slice for r in records] == ["code", "chat", "code", "chat"]
    assert all(r.accepted_tokens == 10 and r.verify_steps == 43 and r.steps == [] for r in records)
    assert records[1].prompt == tokenizer.apply_chat_template(good[1]["request"]["messages"],
                                                              add_generation_prompt=True, tokenize=False)


def test_the_command_prints_counts_and_refuses_a_file_without_records(tmp_path, tokenizer_dir, capsys):
    path = write_lines(tmp_path / "t.jsonl", exchanges(2))
    argv = ["ingest", str(path), "--log-dir", str(tmp_path / "logs"), "--tokenizer", str(tokenizer_dir),
            "--source", "vllm"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == 2 and summary["source"] == "vllm"
    assert summary["quarantine"].endswith("ingest/t.jsonl.quarantine.jsonl")  # in the state dir by default
    # a chat line without a tokenizer (no reference target in this state dir) gives no record
    chat_only = write_lines(tmp_path / "chat.jsonl", exchanges(2)[1:])
    assert main(["ingest", str(chat_only), "--log-dir", str(tmp_path / "logs")]) == 2
    assert json.loads(capsys.readouterr().out)["quarantine_by_kind"] == {"no_chat_template": 1}
    assert main(["ingest", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_mining_derives_token_ids_from_the_text_of_records_without_them(tmp_path, tokenizer_dir, tokenizer):
    ingest(write_lines(tmp_path / "t.jsonl", exchanges(24)), tmp_path / "logs", tmp_path / "q.jsonl", tokenizer)
    config = fast_config(tokenizer=str(tokenizer_dir), holdout_fraction=0.25)
    manifest = mine(tmp_path / "logs", tmp_path / "out", config)
    assert manifest["counts"]["kept"] == 24 and manifest["counts"]["quarantined"] == 0
    assert manifest["slices"]["code"]["drafted_tokens"] == 12 * 129  # the reported totals, per slice
    assert manifest["slices"]["chat"]["mean_accepted_length"] == pytest.approx(1 + 10 / 43)
    distill = load_from_disk(str(tmp_path / "out" / "distill"))
    holdout = load_from_disk(str(tmp_path / "out" / "holdout"))
    assert len(distill) > 0 and len(holdout) > 0
    for row in distill:
        assert row["prompt_token_ids"] == tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        assert row["completion_token_ids"] == tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        assert row["served_residual"] == [1.0] * len(row["completion_token_ids"])  # which were drafted: unknown
    assert all(r["max_new_tokens"] == len(r["output_token_ids"]) > 0 for r in holdout)
    # without a tokenizer the ids cannot be derived: those requests are left out, and counted
    bare = mine(tmp_path / "logs", tmp_path / "bare", fast_config(holdout_fraction=0.25))
    assert bare["counts"]["distill"] == bare["counts"]["holdout"] == 0
    assert bare["counts"]["dropped"]["no_token_ids_without_tokenizer"] >= 24 * 0.25
