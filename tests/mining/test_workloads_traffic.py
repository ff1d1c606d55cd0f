"""Workloads (deterministic, offline, JSONL round trip) and traffic through the real Engine on toy models,
mined end to end; plus the `traffic` and `mine` commands."""

from __future__ import annotations

import json

import pytest

from draftwheel.flows.commands import main
from draftwheel.mining.pipeline import mine
from draftwheel.mining.log_reader import list_log_files
from draftwheel.mining.replay_workload import run_traffic
from draftwheel.mining.workloads import (BUILTIN, _function_prefixes, build_workload, library_texts, load_workload,
                              read_workload, write_workload)
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.records import parse_record
from tests.mining.conftest import fast_config


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_workloads_are_deterministic_per_seed_and_labelled(name):
    first = build_workload(name, 12, seed=3)
    assert first == build_workload(name, 12, seed=3)
    assert first != build_workload(name, 12, seed=4)
    assert len(first) == 12 and all(isinstance(i["prompt"], str) and i["prompt"] for i in first)
    expected = {"code", "prose", "chat"} if name == "mixed" else {name}
    assert {i["slice"] for i in first} == expected


def test_code_and_prose_come_from_the_standard_library():
    code = build_workload("code", 5, seed=0)
    assert all(i["prompt"].count("def ") >= 1 and '"""' in i["prompt"] for i in code)
    prose = build_workload("prose", 5, seed=0)
    assert all(len(i["prompt"]) > 200 for i in prose)


def test_two_seeds_of_code_are_two_samples_of_one_distribution():
    """Drawn file by file, seed 1's 80 prompts came from 7 files and seed 2's from 6 others: the traffic
    served after a round was a second shift, not more of the first. Drawn from the whole library at once,
    each seed spreads over many files, and half the later one's come from files the first one drew."""
    file_of = {text: name for name, text in library_texts(_function_prefixes)}

    def files(seed, n):
        return [next(f for body, f in file_of.items() if body in item["prompt"])
                for item in build_workload("code", n, seed)]

    round_files, later_files = files(1, 80), files(2, 40)
    assert len(set(round_files)) >= 30 and len(set(later_files)) >= 20
    shared = sum(f in set(round_files) for f in later_files)
    assert shared >= len(later_files) // 2


def test_jsonl_round_trip_and_errors(tmp_path):
    items = build_workload("mixed", 6, seed=1)
    path = write_workload(items, tmp_path / "w.jsonl")
    assert read_workload(path) == items
    assert load_workload(str(path), 2) == items[:2]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "hi"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_workload(tmp_path / "bad.jsonl")
    (tmp_path / "noslice.jsonl").write_text('{"prompt": "hi"}\n\n')
    assert read_workload(tmp_path / "noslice.jsonl") == [{"prompt": "hi", "slice": "custom"}]
    with pytest.raises(ValueError, match="neither a built-in"):
        load_workload("nonexistent-workload", 3)


@pytest.fixture(scope="module")
def toy_models(tmp_path_factory):
    from draftwheel.serving.testing import tiny_pair

    return tiny_pair(tmp_path_factory.mktemp("toy"))


def test_traffic_writes_valid_records_per_slice_and_they_mine(tmp_path, toy_models):
    from draftwheel.serving.loading import engine_from_specs

    target, draft = toy_models
    engine = engine_from_specs(target, draft)
    workload = build_workload("chat", 4, seed=0) + [{"prompt": "def add(a, b):", "slice": "code"}] * 2
    summary = run_traffic(engine, workload, tmp_path / "logs", SamplingParams(max_new_tokens=8))
    assert summary["requests"] == 6 and summary["by_slice"]["chat"]["requests"] == 4
    lines = [line for f in list_log_files(tmp_path / "logs") for line in f.read_bytes().splitlines()]
    records = [parse_record(line) for line in lines]
    assert sorted(r.slice for r in records) == ["chat"] * 4 + ["code"] * 2
    assert all(r.prompt.startswith("<|im_start|>user") for r in records)  # chat template applied
    manifest = mine(tmp_path / "logs", tmp_path / "out", fast_config(tokenizer=str(target), holdout_fraction=0.2))
    assert manifest["counts"]["kept"] == 6 and manifest["counts"]["quarantined"] == 0
    assert manifest["counts"]["holdout"] >= 1 and manifest["counts"]["distill"] >= 1


def test_traffic_refuses_to_log_twice(tmp_path, toy_models):
    from draftwheel.serving.loading import engine_from_specs
    from draftwheel.serving.engine.sink import JsonlSink

    target, draft = toy_models
    with JsonlSink(tmp_path / "own") as sink:
        engine = engine_from_specs(target, draft, sink=sink)
        with pytest.raises(ValueError, match="log_dir"):
            run_traffic(engine, build_workload("chat", 1), tmp_path / "logs")


def test_traffic_and_mine_commands(tmp_path, toy_models, capsys):
    target, draft = toy_models
    workload = write_workload(build_workload("chat", 3, seed=2), tmp_path / "w.jsonl")
    code = main(["traffic", "--workload", str(workload), "--target", str(target), "--draft", str(draft),
                 "--log-dir", str(tmp_path / "logs"), "--max-new-tokens", "6", "--no-progress"])
    assert code == 0 and json.loads(capsys.readouterr().out)["requests"] == 3
    code = main(["traffic", "--workload", str(workload), "--target", str(target), "--draft", str(draft),
                 "--log-dir", str(tmp_path / "batched"), "--max-new-tokens", "6", "--no-progress", "--max-batch", "3"])
    assert code == 0 and json.loads(capsys.readouterr().out)["requests"] == 3
    modes = {r["mode"] for r in map(json.loads, (tmp_path / "logs" / "acceptance.jsonl").read_text().splitlines())}
    assert modes == {"hybrid"}  # as `draftwheel serve` serves by default
    again = ["traffic", "--workload", str(workload), "--target", str(target), "--draft", str(draft),
             "--max-new-tokens", "6", "--no-progress", "--min-path-prob", "0"]
    for _ in range(2):  # the second pass starts from an index of the first one's logs: its prompts recur
        assert main([*again, "--log-dir", str(tmp_path / "twice")]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in (tmp_path / "twice" / "acceptance.jsonl").read_text().splitlines()]
    assert any(step.get("source") == "suffix" for r in records[3:] for step in r["steps"])
    assert main([*again, "--log-dir", str(tmp_path / "alone"), "--no-suffix-tier"]) == 0
    capsys.readouterr()
    assert {json.loads(line)["mode"] for line in (tmp_path / "alone" / "acceptance.jsonl").read_text().splitlines()} \
        == {"draft"}
    assert main(["traffic", "--workload", str(workload), "--max-batch", "0"]) != 0
    assert "--max-batch" in capsys.readouterr().err
    code = main(["mine", "--log-dir", str(tmp_path / "logs"), "--out", str(tmp_path / "out"), "--tokenizer", str(target),
                 "--set", "plot=false", "--set", "holdout_fraction=0.34"])
    assert code == 0 and json.loads(capsys.readouterr().out)["counts"]["kept"] == 3
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert main(["traffic", "--workload", "nope", "--target", str(target)]) == 2


def test_batched_traffic_writes_the_same_records_in_workload_order(tmp_path, toy_models):
    """A BatchEngine takes the whole workload at once; the logs hold one record per item, in workload order,
    with the greedy output one at a time gives, and an item the engine refuses is counted, not fatal."""
    from draftwheel.serving.engine.batching import BatchConfig, BatchEngine
    from draftwheel.serving.loading import engine_from_specs

    target, draft = toy_models
    workload = build_workload("chat", 5, seed=3) + [{"prompt": "word " * 5000, "slice": "chat"}]
    params = SamplingParams(max_new_tokens=8)
    serial = run_traffic(engine_from_specs(target, draft), workload, tmp_path / "serial", params)
    with BatchEngine(engine_from_specs(target, draft), BatchConfig(max_batch=4, max_waiting=2)) as batch:
        batched = run_traffic(batch, workload, tmp_path / "batched", params)
    assert batched["requests"] == serial["requests"] == 5
    assert batched["failed"] == serial["failed"] and sum(batched["failed"].values()) == 1
    logs = {name: [parse_record(line) for f in list_log_files(tmp_path / name) for line in f.read_bytes().splitlines()]
            for name in ("serial", "batched")}
    assert [r.prompt for r in logs["batched"]] == [r.prompt for r in logs["serial"]]
    assert [r.output_token_ids for r in logs["batched"]] == [r.output_token_ids for r in logs["serial"]]


def test_serving_picks_the_engine_itself_or_a_batch_engine_over_it(toy_models):
    from draftwheel.mining.replay_workload import serving
    from draftwheel.serving.engine.batching import BatchEngine
    from draftwheel.serving.loading import engine_from_specs

    engine = engine_from_specs(*toy_models)
    with serving(engine, 1) as served:
        assert served is engine  # one request at a time
    with serving(engine, 3) as served:
        assert isinstance(served, BatchEngine) and served.engine is engine and served.config.max_batch == 3
    with pytest.raises(ValueError, match="max_batch"):
        serving(engine, 0)
