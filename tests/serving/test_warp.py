"""`draftwheel.serving.engine.sampling.warp` against transformers' own warpers, as probabilities.

The reference is what HF `generate` does when sampling: `TemperatureLogitsWarper`, then
`TopKLogitsWarper`, then `TopPLogitsWarper` (the order of `GenerationMixin._get_logits_processor`), then
a softmax. The grid is temperature x top_k x top_p over random logits (no ties: every probability must
match) and over small-integer logits, where nearly every top-k and top-p cut falls inside a group of
exactly tied tokens.

Ties: both keep *every* token tied with the k-th (top-k is a threshold on the value). At a top-p cut
inside a tied group both keep the same number of the tied tokens, and so the same probabilities and
the same kept mass, but not always the same ones: each keeps the tied tokens that come first in its own
sort (descending here, ascending in HF), and torch.sort does not promise an order for equal values.
Neither choice is more lossless than the other. Speculative sampling is exact for the target law
`warp(target logits)` as long as that law is one function of the row, the same in the one-row call of
plain sampling and in the [k+1, V] call of verification; the last test checks exactly that, on
bfloat16-rounded logits full of ties.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.sampling import warp

TEMPERATURES = (1.0, 0.7, 0.3)
TOP_KS = (0, 1, 3, 50)
TOP_PS = (1.0, 0.9, 0.5, 0.05)
GRID = list(itertools.product(TEMPERATURES, TOP_KS, TOP_PS))


def hf_warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """logits[N, V] -> probabilities[N, V] the way HF generate samples (top_k 0 and top_p 1 are off)."""
    scores = logits.float().clone()
    input_ids = torch.zeros((scores.shape[0], 1), dtype=torch.long)  # unused by these warpers
    scores = TemperatureLogitsWarper(temperature)(input_ids, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(input_ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(input_ids, scores)
    return scores.softmax(-1)


def ours(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    return warp(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))


def random_logits(vocab: int, rows: int = 16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=generator) * 2.5


def tied_logits(vocab: int, rows: int = 16, seed: int = 1) -> torch.Tensor:
    """Small integers: a handful of values shared by many tokens, so the cuts fall inside tied groups."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 4, (rows, vocab), generator=generator).float()


def assert_equal_up_to_tie_order(logits: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> None:
    """Within every group of exactly tied logits the sorted probabilities agree; a token with no tie
    must have exactly HF's probability."""
    for row, (values, p, q) in enumerate(zip(logits, got, want)):
        for value in values.unique():
            members = values == value
            torch.testing.assert_close(p[members].sort().values, q[members].sort().values,
                                       atol=1e-6, rtol=1e-5, msg=f"row {row}, logit {value.item()}")


@pytest.mark.parametrize("vocab", [100, 40])  # 40: top_k 50 is above the vocabulary (off, as in HF)
@pytest.mark.parametrize("temperature, top_k, top_p", GRID)
def test_warp_matches_hf_on_random_logits(temperature, top_k, top_p, vocab):
    logits = random_logits(vocab)
    torch.testing.assert_close(ours(logits, temperature, top_k, top_p), hf_warp(logits, temperature, top_k, top_p),
                               atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("temperature, top_k, top_p", GRID)
def test_warp_matches_hf_on_tied_logits_up_to_which_tied_token_is_kept(temperature, top_k, top_p):
    logits = tied_logits(64)
    got, want = ours(logits, temperature, top_k, top_p), hf_warp(logits, temperature, top_k, top_p)
    assert_equal_up_to_tie_order(logits, got, want)
    assert torch.equal((got > 0).sum(-1), (want > 0).sum(-1))  # as many tokens kept, row by row


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("top_k, tied_at", [(1, 0), (2, 1), (3, 1)])
def test_top_k_keeps_every_token_tied_with_the_kth_as_hf_does(temperature, top_k, tied_at):
    """Three tokens share the value at rank `tied_at`: a cut at rank top_k inside them keeps all three."""
    values = torch.tensor([5.0, 3.0, 1.0, 0.5, 0.0, -1.0])
    logits = torch.cat([values[:tied_at + 1], values[tied_at:tied_at + 1].repeat(2), values[tied_at + 1:]])
    perm = torch.randperm(len(logits), generator=torch.Generator().manual_seed(0))
    logits = logits[perm][None]  # tied tokens at scattered ids, not adjacent
    got, want = ours(logits, temperature, top_k, 1.0), hf_warp(logits, temperature, top_k, 1.0)
    torch.testing.assert_close(got, want)
    assert int((got > 0).sum()) == tied_at + 3 > top_k


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_a_top_p_cut_inside_a_tied_group_keeps_as_many_tied_tokens_as_hf(temperature):
    """One top token, five tied ones, a tail: top_p is set to the top token's probability plus 2.5 tied
    ones, so the smallest nucleus reaching it holds the top token and three of the five."""
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, -1.0]])
    probs = (logits / temperature).softmax(-1)[0]
    top_p = float(probs[0] + 2.5 * probs[1])
    assert top_p < 1.0
    got, want = ours(logits, temperature, 0, top_p), hf_warp(logits, temperature, 0, top_p)
    tied = logits[0] == 1.0
    assert int((got[0, tied] > 0).sum()) == int((want[0, tied] > 0).sum()) == 3
    assert got[0, ~tied].tolist() == pytest.approx(want[0, ~tied].tolist(), abs=1e-6)
    assert_equal_up_to_tie_order(logits, got, want)


@pytest.mark.parametrize("vocab", [257, 32000])
@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (0, 0.5), (50, 0.9), (3, 1.0)])
def test_warp_is_one_function_of_the_row_even_with_ties(vocab, top_k, top_p):
    """Plain sampling warps one row [V]; verification warps [k+1, V] at once. Lossless speculative
    sampling needs the two to agree bit for bit, ties included: bfloat16-rounded logits tie often."""
    logits = (random_logits(vocab, rows=5, seed=2) * 2).bfloat16().float()
    assert len(logits[0].unique()) < vocab  # the rows do hold ties
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)
    batch = warp(logits, params)
    for row in range(len(logits)):
        assert torch.equal(batch[row], warp(logits[row], params)), row
