"""The one-pass greedy check against the target's own decoding, on a tiny random target."""

from __future__ import annotations

import pytest
import torch

from draftwheel.serving.engine.engine import Engine
from draftwheel.evaluation.greedy_check import greedy_divergence
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams

PROMPTS = ["def add(a, b):", "Hello there, how", "SELECT name FROM", "The quick brown fox"]
MAX_NEW = 40


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def plain(dirs, request):
    """(engine, completions): the target alone decoding PROMPTS greedily, in each serving dtype."""
    target_dir, _ = dirs
    engine = Engine(load_model(target_dir), dtype=request.param)
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW), mode="autoregressive")
    return engine, completions


def _divergence(engine, completion, token_ids, max_new=MAX_NEW, eos=None, chunk=16):
    return greedy_divergence(engine.target.model, engine.eos_ids if eos is None else eos,
                             completion.prompt_token_ids, token_ids, max_new, chunk=chunk)


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_the_target_own_greedy_output_passes(plain, chunk):
    engine, completions = plain
    for completion in completions:
        assert len(completion.token_ids) == MAX_NEW  # a random target never emits EOS here
        assert _divergence(engine, completion, completion.token_ids, chunk=chunk) is None


def test_a_changed_token_is_found_at_its_position(plain):
    engine, completions = plain
    vocab = engine.target.model.config.vocab_size
    for position in (0, 7, MAX_NEW - 1):
        changed = list(completions[0].token_ids)
        changed[position] = (changed[position] + 1) % vocab
        assert _divergence(engine, completions[0], changed) == position


def test_the_stop_must_be_where_greedy_decoding_stops(plain):
    engine, completions = plain
    ids = completions[1].token_ids
    # An early end with no EOS: greedy decoding would have gone on.
    assert _divergence(engine, completions[1], ids[:10]) == 10
    # Tokens past max_new_tokens.
    assert _divergence(engine, completions[1], ids, max_new=MAX_NEW - 5) == MAX_NEW - 5
    # With one of its tokens as an EOS, greedy decoding stops at that token's first occurrence: the
    # output must end there, and then passes.
    eos = ids[-1]
    first = ids.index(eos)
    assert first < len(ids) - 1  # toy targets repeat themselves
    assert _divergence(engine, completions[1], ids, eos={eos}) == first + 1
    assert _divergence(engine, completions[1], ids[:first + 1], eos={eos}) is None


def test_an_empty_output_passes_only_when_nothing_was_asked(plain):
    engine, completions = plain
    assert _divergence(engine, completions[2], [], max_new=0) is None
    assert _divergence(engine, completions[2], []) == 0
