"""benchmarks/served_ab.py: its settings' parsing (bad keys and values named) and one comparison of two
hybrid settings against plain decoding on toy models, lossless in both arms."""

from __future__ import annotations

import pytest

from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixIndex, target_key
from tests.serving.test_engine import PROMPTS, hf_greedy
from tests.serving.test_suffix_engine import corrupted


@pytest.fixture()
def served_ab(load_benchmark):
    return load_benchmark("served_ab")


def test_help(served_ab, help_text):
    assert "--repeats" in help_text(served_ab)


def test_settings_are_parsed_and_bad_ones_named(served_ab):
    assert served_ab.parse_setting(["index_branch=false"]) == {"index_branch": False, "min_path_prob": 0.25}
    assert served_ab.parse_setting(["runner_up=false"]) == {"runner_up": False, "min_path_prob": 0.25}
    assert served_ab.parse_setting(["min_path_prob=0.1"]) == {"min_path_prob": 0.1}
    with pytest.raises(SystemExit, match="setting 'k_max'"):
        served_ab.parse_setting(["k_max=3"])
    with pytest.raises(SystemExit, match="index_branch: bad value 'maybe'"):
        served_ab.parse_setting(["index_branch=maybe"])


def test_index_settings_go_to_the_index_not_the_engine(served_ab):
    setting = served_ab.parse_setting(["suffix_spec_factor=2", "index_branch=false"])
    engine, index = served_ab.split_setting(setting)
    assert engine == {"index_branch": False, "min_path_prob": 0.25}
    assert index == {"spec_factor": 2.0}
    with pytest.raises(SystemExit, match="suffix_spec_offset: bad value 'long'"):
        served_ab.parse_setting(["suffix_spec_offset=long"])


def test_compare_measures_both_settings_against_plain(served_ab):
    from tests.serving.test_eagle import fit_draft
    from draftwheel.serving.testing import build_tokenizer, tiny_llama

    tokenizer = build_tokenizer()
    model = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    target, draft = from_objects(model, tokenizer, "target"), from_objects(fit_draft(model, tokenizer, steps=100),
                                                                           tokenizer, "eagle")
    index = SuffixIndex(target_key(target.model_id))
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        index.add(ids + corrupted(hf_greedy(model, ids, 30), every=3))
    rows = {"chat": [{"prompt": p, "slice": "chat"} for p in PROMPTS[:3]]}
    params = SamplingParams(max_new_tokens=16, temperature=0.0, k=3)
    view = ReadOnlyIndex(index)
    result = served_ab.compare(target, draft, {"a": view, "b": view}, rows, params,
                               {"index_branch": False}, {"index_branch": True})
    row = result["chat"]
    assert row["a"]["identical"] == row["b"]["identical"] == "3/3"
    assert row["a"]["mal"] >= 1.0 and row["b_over_a"] == pytest.approx(row["b"]["speedup"] / row["a"]["speedup"])
    means = served_ab.summary([result, result])
    assert means["chat"]["b_over_a"] == pytest.approx(row["b_over_a"])
    assert "| chat |" in served_ab.table_text(means)


def test_modelled_time_repeats_the_same_steps_and_prices_them(served_ab):
    """With the cost model measured once, each arm decodes along the same steps in every repetition, so
    its MAL and modelled speed repeat exactly; the wall clock still times both."""
    from tests.serving.test_eagle import fit_draft
    from draftwheel.serving.testing import build_tokenizer, tiny_llama

    tokenizer = build_tokenizer()
    model = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    target, draft = from_objects(model, tokenizer, "target"), from_objects(fit_draft(model, tokenizer, steps=100),
                                                                           tokenizer, "eagle")
    params = SamplingParams(max_new_tokens=16, temperature=0.0, k=3)
    costs = served_ab.cost_model(target, draft, PROMPTS[0], params)
    assert len(costs["row_costs"]) == 3 + 16 + 1 and costs["row_costs"][0] == 1.0
    assert costs["time"].row_slope >= 0.0 and costs["c"] > 0.0
    view = ReadOnlyIndex(SuffixIndex(target_key(target.model_id)))
    rows = {"chat": [{"prompt": p, "slice": "chat"} for p in PROMPTS[:3]]}
    first, second = (served_ab.compare(target, draft, {"a": view, "b": view}, rows, params, {"index_branch": False},
                                       {"index_branch": True}, costs) for _ in range(2))
    for arm in ("a", "b"):
        assert first["chat"][arm]["mal"] == second["chat"][arm]["mal"]
        assert first["chat"][arm]["modelled"] == pytest.approx(second["chat"][arm]["modelled"])
        assert first["chat"][arm]["identical"] == "3/3"
    assert "B ÷ A modelled" in served_ab.table_text(served_ab.summary([first, second]))
