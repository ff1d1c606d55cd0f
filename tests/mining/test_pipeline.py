"""End-to-end mining on small synthetic logs: dataset columns, hold-out isolation, caps, PII, dedupe,
preference-pair alignment, manifest sha256s, and the config file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from datasets import load_from_disk

from draftwheel.config import ConfigError, load_config
from draftwheel.mining.config import MiningConfig
from draftwheel.mining.dedupe import NearDupIndex, normalize
from draftwheel.mining.outputs import path_sha256
from draftwheel.mining.pipeline import mine
from tests.mining.conftest import fast_config, make_record, write_lines

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = {
    "distill": ["prompt", "completion", "prompt_token_ids", "completion_token_ids", "slice", "weight",
                "served_residual"],
    "preference": ["prompt", "chosen", "rejected", "prompt_token_ids", "chosen_token_ids", "rejected_token_ids", "slice"],
    "holdout": ["request_id", "prompt", "prompt_token_ids", "slice", "max_new_tokens", "output_token_ids"],
}


def _records(n: int = 400) -> list[dict]:
    records = [make_record(i, ts=2000.0 + i) for i in range(n)]
    for i in range(0, n, 25):  # PII in some prompts
        records[i]["prompt"] = records[i]["prompt"].replace("task", f"mail user{i}@example.com about task", 1)
    for i in range(1, n, 40):  # exact duplicates (case/spacing differ) of an earlier prompt
        records[i]["prompt"] = records[i - 1]["prompt"].upper().replace(" ", "  ")
    return records


@pytest.fixture(scope="module")
def mined(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("mined")
    records = _records()
    write_lines(root / "logs" / "acceptance.jsonl", records)
    config = fast_config(tokenizer=str(tokenizer_dir), holdout_fraction=0.25, hard_quantile=0.2, plot=True)
    manifest = mine(root / "logs", root / "out", config)
    return root / "out", manifest, records, config


def test_datasets_have_the_contract_columns(mined):
    out, manifest, _, _ = mined
    for name, columns in COLUMNS.items():
        dataset = load_from_disk(str(out / name))
        assert dataset.column_names == columns
        assert len(dataset) == manifest["outputs"][name]["rows"] > 0


def test_manifest_sha256s_match_the_files_on_disk(mined):
    out, manifest, _, _ = mined
    assert json.loads((out / "manifest.json").read_text())["outputs"] == manifest["outputs"]
    for name, entry in manifest["outputs"].items():
        assert entry["sha256"] == path_sha256(out / entry["path"]), name
    assert (out / "acceptance_by_slice.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_manifest_counts_output_token_frequencies_of_the_datasets(mined):
    """`output_tokens`: counts of the written distill/holdout outputs, the top tokens, and the coverage of
    the top N distill tokens (monotone in N, 1.0 once N covers every distinct token)."""
    from draftwheel.mining.token_freq import coverage, token_table

    out, manifest, _, _ = mined
    table = manifest["output_tokens"]
    distill = Counter(t for ids in load_from_disk(str(out / "distill"))["completion_token_ids"] for t in ids)
    holdout = Counter(t for ids in load_from_disk(str(out / "holdout"))["output_token_ids"] for t in ids)
    assert table["distill_tokens"] == sum(distill.values()) > 0 and table["distill_distinct"] == len(distill)
    assert table["holdout_tokens"] == sum(holdout.values()) > 0
    assert table["top"][0] == list(distill.most_common(1)[0])
    shares = [table["coverage_of_top_n"][n]["distill"] for n in ("1024", "2048", "4096", "8192")]
    assert shares == sorted(shares) and 0 < shares[0] <= 1.0
    small = token_table(Counter({1: 6, 2: 3, 3: 1}), Counter({1: 1, 4: 1}), sizes=(1, 2, 3))
    assert small["coverage_of_top_n"] == {"1": {"distill": 0.6, "holdout": 0.5}, "2": {"distill": 0.9, "holdout": 0.5},
                                          "3": {"distill": 1.0, "holdout": 0.5}}
    assert coverage(set(), Counter()) == 0.0


def test_holdout_is_latest_and_shares_no_prompt_or_near_duplicate_with_training(mined, tokenizer_dir):
    out, manifest, records, config = mined
    by_id = {r["request_id"]: r for r in records}
    cutoff = manifest["holdout_cutoff_ts"]
    holdout = load_from_disk(str(out / "holdout"))
    assert all(by_id[rid]["ts"] >= cutoff for rid in holdout["request_id"])
    assert len(holdout) == min(config.holdout_max, sum(r["ts"] >= cutoff for r in records))
    train_prompts = load_from_disk(str(out / "distill"))["prompt"]
    early = {normalize(r["prompt"]) for r in records if r["ts"] < cutoff}
    assert all(normalize(p) in early or "<EMAIL>" in p for p in train_prompts)
    near = NearDupIndex(config.near_dup_threshold, config.minhash_perm, config.shingle_words)
    for i, prompt in enumerate(holdout["prompt"]):
        near.add(i, near.signature(prompt))
    assert all(near.find(near.signature(p)) is None for p in train_prompts)
    assert not {normalize(p) for p in holdout["prompt"]} & {normalize(p) for p in train_prompts}


def test_per_slice_caps_and_no_duplicate_training_prompts(mined):
    out, manifest, _, config = mined
    distill = load_from_disk(str(out / "distill"))
    per_slice = Counter(distill["slice"])
    for name, count in per_slice.items():
        selected = manifest["slices"][name]["selected"]
        assert selected["hard"] <= config.max_hard_per_slice and selected["rollback"] <= config.max_rollback_per_slice
        assert selected["uniform"] == round(config.uniform_ratio * (selected["hard"] + selected["rollback"]))
        assert count == sum(selected.values())
    assert len({normalize(p) for p in distill["prompt"]}) == len(distill)


def test_exact_duplicates_collapse_to_one_sample(tmp_path):
    records = [make_record(i, ts=7000.0 + i) for i in range(80)]
    for i, record in enumerate(records):  # five prompts, repeated with case and spacing changes
        base = make_record(i % 5)["prompt"]
        record["prompt"] = base.upper() if i % 2 else base.replace(" ", "   ")
    write_lines(tmp_path / "logs" / "a.jsonl", records)
    config = fast_config(holdout_fraction=0.0, hard_quantile=1.0, max_hard_per_slice=100, uniform_ratio=1.0)
    manifest = mine(tmp_path / "logs", tmp_path / "out", config)
    distill = load_from_disk(str(tmp_path / "out" / "distill"))
    assert len(distill) == 5 == manifest["counts"]["distill"] and len({normalize(p) for p in distill["prompt"]}) == 5


def test_pii_is_scrubbed_and_ids_re_derived(mined, tokenizer_dir):
    from transformers import AutoTokenizer

    out, manifest, _, _ = mined
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = []
    for name in COLUMNS:
        dataset = load_from_disk(str(out / name))
        texts += [v for col in ("prompt", "completion", "chosen", "rejected") if col in dataset.column_names
                  for v in dataset[col]]
        if name != "preference":
            for row in dataset:
                if "<EMAIL>" in row["prompt"]:  # scrubbed: ids re-tokenised from the scrubbed text
                    assert tokenizer.decode(row["prompt_token_ids"]) == row["prompt"]
    assert not any("@example.com" in t for t in texts)
    assert any("<EMAIL>" in t for t in texts)
    assert manifest["redactions"]["total"]["EMAIL"] >= 1


def test_preference_pairs_line_up_with_the_logged_steps(mined):
    out, _, records, _ = mined
    by_prefix = {tuple(r["prompt_token_ids"][:30]): r for r in records}
    preference = load_from_disk(str(out / "preference"))
    checked = 0
    for row in preference:
        record = by_prefix.get(tuple(row["prompt_token_ids"][:30]))
        if record is None or "<EMAIL>" in row["prompt"]:
            continue
        prefix = row["prompt_token_ids"][len(record["prompt_token_ids"]):]
        assert record["output_token_ids"][:len(prefix)] == prefix
        position, found = 0, False
        for step in record["steps"]:
            at = position + step["accepted"]
            if at == len(prefix):
                assert step["accepted"] < step["k"]
                assert row["chosen_token_ids"] == [step["target_token_id"]]
                assert row["rejected_token_ids"] == [step["draft_token_ids"][step["accepted"]]]
                found = True
                break
            position = at + 1
        assert found and row["chosen_token_ids"] != row["rejected_token_ids"]
        checked += 1
    assert checked > 20


def test_without_a_tokenizer_scrubbed_requests_are_left_out_and_preference_is_empty(tmp_path):
    write_lines(tmp_path / "logs" / "a.jsonl", _records(200))
    manifest = mine(tmp_path / "logs", tmp_path / "out", fast_config(hard_quantile=0.5, max_hard_per_slice=100))
    assert manifest["counts"]["preference"] == 0 and manifest["preference_note"]
    assert manifest["counts"]["dropped"]["scrubbed_without_tokenizer"] >= 1
    distill = load_from_disk(str(tmp_path / "out" / "distill"))
    assert len(distill) > 0 and not any("<EMAIL>" in p or "@example.com" in p for p in distill["prompt"])


def test_empty_logs_give_empty_loadable_datasets(tmp_path):
    (tmp_path / "logs").mkdir()
    manifest = mine(tmp_path / "logs", tmp_path / "out", fast_config())
    assert manifest["counts"].get("kept", 0) == 0
    for name in COLUMNS:
        assert len(load_from_disk(str(tmp_path / "out" / name))) == 0


def test_missing_logs_dir_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        mine(tmp_path / "nope", tmp_path / "out", fast_config())


def test_default_config_file_loads_and_bad_values_name_the_field():
    config = load_config(MiningConfig, ROOT / "configs" / "mining.yaml")
    assert config == MiningConfig()
    for override, field in [("holdout_fraction=1.5", "holdout_fraction"), ("hard_quantile=0", "hard_quantile"),
                            ("since=tuesday", "since"), ("max_hard_per_slice=-1", "max_hard_per_slice")]:
        with pytest.raises(ValueError, match=field):
            load_config(MiningConfig, ROOT / "configs" / "mining.yaml", [override])
    with pytest.raises(ConfigError, match="holdout_fractoin"):
        load_config(MiningConfig, None, ["holdout_fractoin=0.2"])


def test_request_stats_and_per_position_acceptance():
    from draftwheel.mining.stats import SliceStats, request_stats
    from tests.mining.conftest import make_record as mk

    record = mk(0)
    steps = [{"k": 4, "accepted": 4, "draft_token_ids": [1, 2, 3, 4], "target_token_id": 5},
             {"k": 4, "accepted": 1, "draft_token_ids": [6, 7, 8, 9], "target_token_id": 10},
             {"k": 2, "accepted": 0, "draft_token_ids": [11, 12], "target_token_id": 13},
             {"k": 100, "accepted": 70, "draft_token_ids": [1] * 100, "target_token_id": 1}]  # absurd k: folded, no crash
    record.update(steps=steps, drafted_tokens=110, accepted_tokens=75, verify_steps=4)
    from draftwheel.serving.engine.records import parse_record

    parsed = parse_record(json.dumps(record).encode())
    rate, length, depth, codes = request_stats(parsed)
    assert rate == 75 / 110 and length == (75 + 4) / 4 and depth == 30
    stats = SliceStats()
    stats.add(parsed, rate, depth, codes)
    per_position = stats.per_position()
    # position 0: drafted by all 4 steps, accepted by steps 1, 2 and 4; position 1: drafted 4 times, accepted 2
    assert per_position[:4] == pytest.approx([0.75, 0.5, 2 / 3, 2 / 3], abs=1e-6) and len(per_position) == 63
    assert stats.to_dict()["max_rollback_depth"] == 30


def test_request_stats_of_a_hybrid_request_judge_the_draft_alone():
    from draftwheel.mining.stats import SliceStats, request_stats
    from draftwheel.serving.engine.records import parse_record
    from tests.mining.conftest import make_record as mk

    record = mk(0)
    steps = [{"k": 8, "accepted": 8, "draft_token_ids": [1] * 8, "target_token_id": 5, "source": "suffix"},
             {"k": 4, "accepted": 1, "draft_token_ids": [6, 7, 8, 9], "target_token_id": 10, "source": "eagle3"}]
    record.update(mode="hybrid", steps=steps, drafted_tokens=12, accepted_tokens=9, verify_steps=2)
    parsed = parse_record(json.dumps(record).encode())
    rate, length, depth, codes = request_stats(parsed)
    assert (rate, length, depth) == (0.25, 2.0, 3)  # the index's 8/8 step would make it 0.75 / 5.5 / 3
    stats = SliceStats()
    stats.add(parsed, rate, depth, codes)
    assert stats.to_dict()["acceptance_rate"] == 0.25


def test_mining_again_into_the_same_dir_replaces_the_outputs(tmp_path):
    write_lines(tmp_path / "big" / "a.jsonl", _records(120))
    write_lines(tmp_path / "small" / "a.jsonl", _records(12))
    mine(tmp_path / "big", tmp_path / "out", fast_config())
    manifest = mine(tmp_path / "small", tmp_path / "out", fast_config())
    for name in COLUMNS:
        assert len(load_from_disk(str(tmp_path / "out" / name))) == manifest["outputs"][name]["rows"]
        assert manifest["outputs"][name]["sha256"] == path_sha256(tmp_path / "out" / name)


def test_lines_that_changed_after_the_scan_are_skipped_not_mined(tmp_path):
    from draftwheel.mining.curate import iter_records
    from draftwheel.mining.index import IndexFile
    from draftwheel.mining.first_pass import scan_pass

    log = write_lines(tmp_path / "logs" / "a.jsonl", [make_record(i) for i in range(5)])
    files = [log]
    scan, index = scan_pass(files, tmp_path, tmp_path / "q.jsonl", fast_config())
    rows = next(IndexFile(tmp_path / "index.bin", write=False).chunks())
    assert [r for r, _ in iter_records(files, rows)] == [0, 1, 2, 3, 4]
    write_lines(log, [make_record(i + 10) for i in range(5)])  # rotated away: same path, other requests
    assert list(iter_records(files, rows)) == []


def _near_copies(n: int) -> list[dict]:
    """n requests whose prompts are one-word edits of three base prompts (Jaccard of 3-grams ~0.97)."""
    records = []
    for i in range(n):
        record = make_record(i, ts=5000.0 + i)
        base = make_record(i % 3)["prompt"].split(" ")
        base[10 + i % 50] = f"edit{i}"
        record["prompt"] = " ".join(base)
        records.append(record)
    return records


def test_near_duplicates_collapse_in_training_and_never_shadow_the_holdout(tmp_path):
    write_lines(tmp_path / "logs" / "a.jsonl", _near_copies(60))
    config = fast_config(holdout_fraction=0.0, hard_quantile=1.0, max_hard_per_slice=100, uniform_ratio=0.0)
    manifest = mine(tmp_path / "logs", tmp_path / "out", config)
    # One per base prompt, give or take a MinHash estimate under the threshold (128 permutations).
    assert 3 <= manifest["counts"]["distill"] <= 5
    assert manifest["counts"]["dropped"]["near_duplicate"] >= 55
    manifest = mine(tmp_path / "logs", tmp_path / "out2", fast_config(holdout_fraction=0.5, hard_quantile=1.0,
                                                                       max_hard_per_slice=100, holdout_max=100))
    assert 3 <= manifest["counts"]["holdout"] <= 5 and manifest["counts"]["distill"] <= 2
    assert manifest["counts"]["dropped"]["near_duplicate_of_holdout"] >= 25


def test_distill_rows_carry_the_served_residual_per_completion_token(mined):
    """Each distill row's `served_residual` lines up with its completion tokens, and is 0 exactly on the
    tokens the logged steps drafted and had accepted (draftwheel.mining.residual; the synthetic records are
    an `lm` draft's in mode draft, whose first step emits the first token)."""
    out, _, records, _ = mined
    by_prompt = {tuple(r["prompt_token_ids"]): r for r in records}
    dataset = load_from_disk(str(out / "distill"))
    drafted_somewhere = False
    for row in dataset:
        assert len(row["served_residual"]) == len(row["completion_token_ids"])
        assert set(row["served_residual"]) <= {0.0, 1.0}
        source = by_prompt.get(tuple(row["prompt_token_ids"]))
        if source is not None and row["completion_token_ids"] == source["output_token_ids"]:
            copied = [t for t, r in zip(row["completion_token_ids"], row["served_residual"]) if r == 0.0]
            drafted = [t for step in source["steps"] for t in step["draft_token_ids"][:step["accepted"]]]
            assert copied == drafted[:len(copied)] and len(copied) >= len(drafted) - 4  # (the last step may be cut)
            drafted_somewhere |= bool(drafted)
    assert drafted_somewhere
