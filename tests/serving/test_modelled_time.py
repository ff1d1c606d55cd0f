"""adaptive.ModelledTime: with it, the hybrid's choices are a function of the prompts, not of the
machine's timings; without it they follow the clock. Eagle3 hybrid on a tiny target, greedy, lossless."""

from __future__ import annotations

import pytest

from draftwheel.serving.engine import eagle_decoding
from draftwheel.serving.engine.adaptive import ModelledTime
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.suffix import SuffixIndex, target_key
from tests.serving.test_engine import PROMPTS, hf_greedy


class _Ticks:
    """A stand-in for the loop's `time` module: each perf_counter() call moves `tick` seconds on, so
    a step's drafting time reads as one tick (10 s: the draft looks ruinous; 0: free)."""

    def __init__(self, tick: float):
        self.tick, self.now = tick, 0.0

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture(scope="module")
def models():
    from draftwheel.serving.testing import build_tokenizer, tiny_llama
    from tests.serving.test_eagle import fit_draft

    tokenizer = build_tokenizer()
    model = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    return tokenizer, model, fit_draft(model, tokenizer, steps=100)


def decode(models, tick: float, modelled: ModelledTime | None, monkeypatch) -> list[list[tuple]]:
    tokenizer, model, draft = models
    monkeypatch.setattr(eagle_decoding, "time", _Ticks(tick))
    target = from_objects(model, tokenizer, "target")
    engine = Engine(target, from_objects(draft, tokenizer, "eagle"), modelled_time=modelled,
                    suffix_index=SuffixIndex(target_key(target.model_id)))
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=24, k=3), mode="hybrid")
    for completion in completions:
        assert completion.token_ids == hf_greedy(model, completion.prompt_token_ids, 24)
    return [[(s.source, s.k, s.accepted) for s in c.record.steps] for c in completions]


def test_modelled_time_makes_the_hybrids_choices_independent_of_the_clock(models, monkeypatch):
    measured_slow, measured_free = decode(models, 10.0, None, monkeypatch), decode(models, 0.0, None, monkeypatch)
    assert measured_slow != measured_free  # the measured clock moves the choices
    slow_sources = [source for steps in measured_slow for source, *_ in steps]
    assert slow_sources.count(None) > [s for steps in measured_free for s, *_ in steps].count(None)

    modelled = ModelledTime(row_slope=0.05, draft_c=0.05)
    assert decode(models, 10.0, modelled, monkeypatch) == decode(models, 0.0, modelled, monkeypatch)


def test_modelled_time_prices_rows_and_drafted_tokens():
    assert ModelledTime(row_slope=0.04, draft_c=0.05).times(rows=5, model_drafted=4) == pytest.approx((0.2, 1.16))
    assert ModelledTime(row_slope=0.04, draft_c=0.05).times(rows=1, model_drafted=0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="row_slope and draft_c"):
        ModelledTime(row_slope=-0.1, draft_c=0.05)


def test_modelled_time_reads_a_measured_table_of_row_costs_and_its_slope_past_the_end():
    """A CPU's verify cost is not linear in the rows (a few rows cost a step): with the measured table a
    chain's verify is priced as measured, not by the line through the index's long proposals."""
    table = [1.0, 1.0, 1.0, 1.0, 1.0, 1.1, 1.2]
    modelled = ModelledTime(row_slope=0.04, draft_c=0.05, row_costs=table)
    assert modelled.times(rows=5, model_drafted=4) == pytest.approx((0.2, 1.0))  # the line: 1.16
    assert modelled.verify(7) == 1.2 and modelled.verify(1) == 1.0
    assert modelled.verify(9) == pytest.approx(1.2 + 2 * 0.04)  # past the table: its last entry plus the slope
    for bad in ([], [1.0, 0.0]):
        with pytest.raises(ValueError, match="row_costs"):
            ModelledTime(row_slope=0.04, draft_c=0.05, row_costs=bad)
