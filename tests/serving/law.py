"""The target's exact sampling law, computed without the engine, and a chi-square test against it.

- `hf_warp`: logits -> probabilities through transformers' own logits warpers (temperature, then
  top-k, then top-p: the order `generate` applies them), not `draftwheel.serving.engine.sampling.warp`, so a bug in the
  engine's warp cannot hide in the expected law too.
- `window_law`: the exact joint law of the generated tokens at positions `start .. start+length-1`,
  chaining the target's conditionals p(x_i | prompt, x_<i) from full forwards (no KV cache) over every
  prefix in the warped support, and summing over the tokens before the window.
- `chi_square`: Pearson's X^2 of observed windows against that law, with tiny-expected cells pooled and
  samples outside the support counted, never smoothed away.
- `assert_in_support`: every emitted token of a completion has positive warped target probability.

Nothing here touches the engine's code paths; the tests decide what to sample.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import (
    LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
)

from draftwheel.serving.engine.params import SamplingParams

MIN_EXPECTED = 5.0  # Pearson's X^2 is close to its chi-square law only when every bin expects >= ~5


def hf_warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits[B, V] -> probabilities[B, V], warped by transformers' temperature/top-k/top-p warpers."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(params.temperature)])
    if params.top_k:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers(None, logits.float()).softmax(-1)


@torch.no_grad()
def window_law(model, prompt_ids: list[int], params: SamplingParams, start: int, length: int) -> dict:
    """{(x_start, ..., x_{start+length-1}): probability} under plain sampling from `model`.

    Every prefix of generated tokens with positive probability is expanded one position at a time; the
    prefixes at one depth have equal length, so each depth is one batched forward. The tokens before
    the window are summed out (the window's marginal law)."""
    paths = {(): 1.0}  # generated prefix -> its probability
    for _ in range(start + length):
        prefixes = list(paths)
        ids = torch.tensor([prompt_ids + list(prefix) for prefix in prefixes])  # [B, P + depth]
        probs = hf_warp(model(ids).logits[:, -1], params)  # [B, V]
        paths = {prefix + (token,): paths[prefix] * float(row[token])
                 for prefix, row in zip(prefixes, probs) for token in row.nonzero().flatten().tolist()}
    law: dict = {}
    for path, prob in paths.items():
        law[path[start:]] = law.get(path[start:], 0.0) + prob
    return law


@dataclass
class LawTest:
    pvalue: float
    dof: int
    n: int
    outside_support: int  # samples in cells of expected probability 0
    pooled_cells: int  # cells of expected count < MIN_EXPECTED, pooled into one bin


def chi_square(samples: list[tuple], law: dict) -> LawTest:
    """Pearson's X^2 = sum_bins (observed - expected)^2 / expected of `samples` against `law`.

    Bins: each cell whose expected count n * p >= MIN_EXPECTED is its own bin; all other cells (the
    tiny ones and every cell outside the support, p = 0) form one pooled bin, which takes the smallest
    kept cells until it too expects MIN_EXPECTED. A sample outside the support therefore adds to the
    pooled bin's observed count, where it can only raise X^2, and is counted in `outside_support`.
    Under the null, X^2 is approximately chi-square with (bins - 1) degrees of freedom."""
    n = len(samples)
    total = sum(law.values())
    assert abs(total - 1.0) < 1e-4, f"the law sums to {total}"
    observed = Counter(samples)
    expected = {cell: n * p / total for cell, p in law.items()}  # float rounding only: total is ~1
    outside = sum(count for cell, count in observed.items() if cell not in law)
    kept = sorted((cell for cell in law if expected[cell] >= MIN_EXPECTED), key=expected.get)
    pooled = [cell for cell in law if expected[cell] < MIN_EXPECTED]
    pooled_expected = sum(expected[cell] for cell in pooled)
    while pooled_expected < MIN_EXPECTED and kept:
        cell = kept.pop(0)
        pooled.append(cell)
        pooled_expected += expected[cell]
    obs = [observed[cell] for cell in kept] + [n - sum(observed[cell] for cell in kept)]
    exp = [expected[cell] for cell in kept] + [pooled_expected]
    return LawTest(pvalue=float(chisquare(obs, exp).pvalue), dof=len(obs) - 1, n=n,
                   outside_support=outside, pooled_cells=len(pooled))


@torch.no_grad()
def assert_in_support(model, prompt_ids: list[int], token_ids: list[int], params: SamplingParams) -> None:
    """Each emitted token has positive probability under the warped target given its prefix (one forward
    over prompt + output reads every position's conditional)."""
    if not token_ids:
        return
    ids = torch.tensor([prompt_ids + token_ids])
    logits = model(ids).logits[0, len(prompt_ids) - 1: -1]  # [T, V]: row i predicts token_ids[i]
    probs = hf_warp(logits, params)[torch.arange(len(token_ids)), torch.tensor(token_ids)]
    zero = (probs == 0).nonzero().flatten().tolist()
    assert not zero, f"tokens at positions {zero} of {token_ids} are outside the target's support"
