"""benchmarks/headroom.py: the policies' walks, and the per-position acceptance table against the engine
itself -- walking the table as mode suffix or mode draft would gives exactly the steps those modes take."""

from __future__ import annotations

import pytest

from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.suffix import SuffixConfig, SuffixIndex, target_key
from tests.serving.test_engine import PROMPTS
from tests.serving.test_suffix_engine import corrupted


@pytest.fixture()
def headroom(load_benchmark):
    return load_benchmark("headroom")


def test_help(headroom, help_text):
    assert "--drafts" in help_text(headroom)


def test_walks_follow_their_policy(headroom):
    # position: (index accepted or None without a proposal, draft accepted); a step accepting a emits a + 1
    table = [(1, 3), (0, 0), (None, 2), (None, 0), (None, 2), (1, 0), (None, 1), (2, 0), (None, 0), (None, 0)]
    assert headroom.walk(table, "index_only") == [1, 0, 0, 0, 1, 2]  # positions 0, 2, 3, 4, 5, 7
    assert headroom.walk(table, "draft_only") == [3, 2, 0, 0, 0]  # 0, 4, 7, 8, 9
    assert headroom.walk(table, "index_first") == [1, 2, 1, 2]  # 0, 2, 5, 7
    assert headroom.walk(table, "max") == [3, 2, 2]  # 0, 4, 7
    assert headroom.mean_accepted_length([[3, 0], [1]]) == pytest.approx((4 + 1 + 2) / 3)
    assert headroom.mean_accepted_length([]) == 1.0


@pytest.fixture(scope="module")
def eagle_pair():
    from tests.serving.test_eagle import fit_draft
    from draftwheel.serving.testing import build_tokenizer, tiny_llama

    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    return tokenizer, target, fit_draft(target, tokenizer, steps=150)


@pytest.mark.parametrize("cut", [0.0, 0.2])
def test_the_table_walks_as_the_engine_decodes(headroom, eagle_pair, cut):
    tokenizer, target, draft = eagle_pair
    loaded = from_objects(target, tokenizer, "target")
    # no stretch: how much of it a loop verifies follows the measured row cost, which the counts leave out
    index = SuffixIndex(target_key(loaded.model_id), SuffixConfig(stretch_factor=1.0))
    params = SamplingParams(max_new_tokens=24, temperature=0.0, k=3)
    plain = Engine(loaded)
    for prompt in PROMPTS[:2]:  # the index knows a corrupted copy of these outputs
        done = plain.generate([prompt], params, mode="autoregressive")[0]
        index.add(done.prompt_token_ids + corrupted(done.token_ids))
    suffix = Engine(loaded, suffix_index=index)
    alone = Engine(loaded, from_objects(draft, tokenizer, "eagle"), min_path_prob=cut)
    tables = []
    for prompt in PROMPTS[:3]:
        done = plain.generate([prompt], params, mode="autoregressive")[0]
        tables += [table := list(zip(headroom.index_column(index, done.prompt_token_ids, done.token_ids),
                                     headroom.draft_column(target, draft, done.prompt_token_ids, done.token_ids,
                                                           params.k, cut, plain.eos_ids)))]
        by_suffix = suffix.generate([prompt], params, mode="suffix")[0]
        by_draft = alone.generate([prompt], params, mode="draft")[0]
        assert by_suffix.token_ids == by_draft.token_ids == done.token_ids
        # mode suffix records its prefill as a step; the eagle3 loop emits the prefill's token without one
        assert headroom.walk(table, "index_only") == [s.accepted for s in by_suffix.record.steps[1:]]
        assert headroom.walk(table, "draft_only") == [s.accepted for s in by_draft.record.steps]
    positions = [position for table in tables for position in table]
    assert any(by_index for by_index, _ in positions), "the index proposed nothing that was accepted"
    assert any(by_draft for _, by_draft in positions), "the draft drafted nothing that was accepted"


def test_only_eagle3_drafts_are_read(headroom, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path))
    from draftwheel.serving.testing import build_tokenizer, save_model, tiny_llama

    tokenizer = build_tokenizer()
    small = save_model(tiny_llama(tokenizer, n_layers=1, seed=1), tokenizer, tmp_path / "lm-draft")
    monkeypatch.setattr("draftwheel.serving.engine.reference.ensure_reference_target",
                        lambda _: save_model(tiny_llama(tokenizer, n_layers=2, seed=0), tokenizer, tmp_path / "t"))
    with pytest.raises(SystemExit, match="lm draft"):
        headroom.main(["--drafts", str(small), "--no-tracking", "--eval", "1"])
