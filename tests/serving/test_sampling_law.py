"""Sampled output follows the target's law in every mode, on steps that draft several tokens.

Speculative sampling is lossless: whatever the draft proposes, the emitted tokens are distributed as
plain sampling from the (warped) target. Each mode runs on one tiny random Llama target: `lm` (a noisy
copy of the target as a separate draft LM), `eagle3` without and with the chain cut (`min_path_prob`),
`medusa` (heads fitted for a few hundred steps), `suffix` (the model-free suffix index) and `hybrid`
(eagle3 + the suffix index).

The law test. Each run samples `max_new_tokens=4` tokens of PROMPT with its own seed; the outcome is the
window of generated tokens 2..4. In every mode the first token comes from the target's prefill alone,
so the window is what the next step produces when it drafts 2 tokens (k is clamped to `remaining - 1`
= 2): two drafted positions and the bonus position; after a rejection a 1-token step follows. The expected law
of the window comes from `tests.serving.law.window_law`: full target forwards through transformers' own
warpers, chained over the positions and summed over token 1. Pearson's X^2 = sum (obs - exp)^2 / exp
over the window's cells (those expecting < 5 of the N samples pooled into one bin with every cell
outside the support, see `chi_square`) is approximately chi-square with (bins - 1) dof under the null.
A mode passes with p > 1e-3 and no sample outside the support (impossible under the null, so never
smoothed away). Runs are seeded, so each p-value is deterministic; over the 12 law tests a correct
engine would fail one for about 1 seed set in 80.

Mutation controls show that the same statistic can fail: the decoding loops' `verify_sampled` is
swapped for a broken one (the correction drawn from p instead of the residual (p - q)+; every draft
accepted; no bonus token), and the same N samples and X^2 must give p < 1e-4.

Longer runs (`max_new_tokens=40`, k=5) check what the 4-token window cannot: steps drafting up to 5
tokens (more for the suffix index), each emitted token inside the target's warped support.

Determinism: the hybrid's choices between the index and the draft depend on timings carried across
requests (`StepPace`); each run gets its own slice, so a fresh pace, and within 4 tokens its choices
depend on the seed alone. Its index is read-only (it knows only the greedy branch after PROMPT), so the
window is drafted by the index on that branch and by eagle3 on the others.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import draftwheel.serving.engine.decoding
import draftwheel.serving.engine.eagle_decoding
import draftwheel.serving.engine.suffix_decoding
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.medusa import MedusaHeads
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixIndex, target_key
from draftwheel.serving.testing import build_tokenizer, tiny_llama
from draftwheel.serving.engine.verify import verify_sampled
from tests.serving.law import assert_in_support, chi_square, window_law
from tests.serving.test_eagle import fit_draft
from tests.serving.test_engine import PROMPTS, hf_greedy, noisy_copy

PROMPT = "The quick brown"
START, LENGTH = 1, 3  # the window: generated tokens 2..4
N = 500  # seeded runs per law test
# Both warpers bind in both settings: top-k cuts at ~all positions of the window's law, top-p at 1 in 2.
HOT = SamplingParams(max_new_tokens=START + LENGTH, temperature=1.0, top_k=3, top_p=0.8, k=4)
WARM = SamplingParams(max_new_tokens=START + LENGTH, temperature=0.7, top_k=3, top_p=0.9, k=4)
MODES = ["lm", "eagle3", "eagle3-cut", "medusa", "suffix", "hybrid"]


@pytest.fixture(scope="module")
def models():
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    with torch.no_grad():
        # Sharper conditionals: the window's law has fewer cells (~25 instead of ~60), so X^2 spends fewer
        # degrees of freedom and the mutation controls below are rejected with a wide margin.
        target.lm_head.weight.mul_(2.0)
    return SimpleNamespace(
        tokenizer=tokenizer, target=target,
        oracle=copy.deepcopy(target),  # taken before any engine adopts the target (and swaps its attention)
        lm=noisy_copy(target, 0.3), eagle=fit_draft(target, tokenizer, steps=150),
        medusa=fit_heads(target, tokenizer, n_heads=5), known=known_sequences(target, tokenizer),
    )


def fit_heads(target, tokenizer, n_heads: int, steps: int = 200) -> MedusaHeads:
    """Medusa heads fitted for a few hundred steps to the target's own distributions (forward KL) along its
    greedy continuations of PROMPTS: partial acceptance, so both verify paths run."""
    torch.manual_seed(0)
    sequences = [ids + hf_greedy(target, ids, 40) for ids in (tokenizer(p)["input_ids"] for p in PROMPTS)]
    width = min(len(s) for s in sequences)
    with torch.no_grad():
        out = target(torch.tensor([s[:width] for s in sequences]), output_hidden_states=True)
    hidden, teacher = out.hidden_states[-1], out.logits.float().log_softmax(-1)  # [B, T, H], [B, T, V]
    heads = MedusaHeads.for_target(target, n_heads=n_heads)
    optimizer = torch.optim.Adam(heads.trainable_parameters(), lr=3e-3)
    for _ in range(steps):
        # head i at position t predicts token t + i + 2, whose law the target gives at position t + i + 1
        loss = sum(F.kl_div(heads.head_logits(i, hidden[:, : width - i - 1]).float().log_softmax(-1),
                            teacher[:, i + 1:], log_target=True, reduction="batchmean") for i in range(n_heads))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return heads.eval()


def known_sequences(target, tokenizer) -> list[list[int]]:
    """PROMPTS[:3], each with the target's 41-token greedy continuation: the suffix index's first content."""
    return [ids + hf_greedy(target, ids, 41) for ids in (tokenizer(p)["input_ids"] for p in PROMPTS[:3])]


def seeded_index(models, target) -> SuffixIndex:
    index = SuffixIndex(target_key(target.model_id))
    for tokens in models.known:
        index.add(tokens)
    return index


def make_engine(models, mode: str) -> tuple[Engine, str]:
    """A fresh engine for `mode` (a fresh suffix index too) and the engine mode to request."""
    target = from_objects(models.target, models.tokenizer, "target")
    eagle = from_objects(models.eagle, models.tokenizer, "eagle")
    if mode == "lm":
        return Engine(target, from_objects(models.lm, models.tokenizer, "lm")), "draft"
    if mode == "eagle3":
        return Engine(target, eagle), "draft"
    if mode == "eagle3-cut":
        # Cuts about 1 chain in 5: the draft's q(x) for its first token is 1 (one token survives the
        # warpers) or, in about 1 step in 5, below 0.7.
        return Engine(target, eagle, min_path_prob=0.7), "draft"
    if mode == "medusa":
        return Engine(target, medusa=models.medusa), "medusa"
    if mode == "suffix":  # the index learns every finished run, so it soon proposes on every branch
        return Engine(target, suffix_index=seeded_index(models, target)), "suffix"
    # A read-only index knows only the greedy branch: the index drafts there, eagle3 on the other branches.
    return Engine(target, eagle, suffix_index=ReadOnlyIndex(seeded_index(models, target))), "hybrid"


def sample(engine: Engine, mode: str, params: SamplingParams, n: int, prompt: str = PROMPT):
    """n seeded completions. Each request has its own slice, so the hybrid's StepPace starts fresh in each
    and its choices depend on the request's seed alone, not on wall-clock timings of earlier requests."""
    return [engine.generate([prompt], dataclasses.replace(params, seed=seed), mode=mode, slice=f"run-{seed}")[0]
            for seed in range(n)]


def law_test(models, completions, params):
    prompt = models.tokenizer(PROMPT)["input_ids"]
    law = window_law(models.oracle, prompt, params, START, LENGTH)
    return chi_square([tuple(c.token_ids[START:START + LENGTH]) for c in completions], law)


def window_steps(completion) -> list:
    """The recorded steps that emitted a token inside the window."""
    steps = []
    emitted = len(completion.token_ids) - sum(s.accepted + 1 for s in completion.record.steps)  # by a prefill
    for step in completion.record.steps:
        if emitted < START + LENGTH and emitted + step.accepted + 1 > START:
            steps.append(step)
        emitted += step.accepted + 1
    return steps


@pytest.mark.parametrize("params", [HOT, WARM], ids=["t1.0", "t0.7"])
@pytest.mark.parametrize("mode", MODES)
def test_window_follows_target_law(models, mode, params):
    """Tokens 2..4 follow the target's exact law (module docstring), and the window was produced by steps
    that drafted 2 tokens, with both full acceptances (the bonus path) and rejections."""
    engine, engine_mode = make_engine(models, mode)
    completions = sample(engine, engine_mode, params, N)
    result = law_test(models, completions, params)
    steps = [s for c in completions for s in window_steps(c)]
    drafted = Counter(s.k for s in steps)
    sources = Counter(s.source for s in steps if s.k)
    print(f"{mode} T={params.temperature}: drafted per step {dict(sorted(drafted.items()))} "
          f"sources {dict(sources)} {result}")
    assert result.outside_support == 0
    assert result.pvalue > 1e-3, result
    widest = 2
    assert drafted[widest] > N // 4, drafted
    assert any(s.accepted == s.k == widest for s in steps), "no fully accepted chain: the bonus path is untested"
    assert any(s.accepted < s.k for s in steps if s.k == widest), "no rejection inside a chain"
    if mode == "eagle3-cut":  # the first step may draft 2 tokens; a cut chain drafted 1
        cut = sum(c.record.steps[0].k == 1 for c in completions)
        assert N // 10 < cut < N - N // 10, f"{cut} of {N} first chains cut"
    if mode in ("suffix", "hybrid"):
        assert sources["suffix"] > N // 10, sources
    if mode == "hybrid":
        assert sources["eagle3"] > N // 10, sources


def resamples_from_p(draft_tokens, draft_probs, target_probs, generator):
    """Mutant: at the first rejection the correction is drawn from p, not from the residual (p - q)+."""
    emitted, accepted = verify_sampled(draft_tokens, draft_probs, target_probs, generator)
    if accepted < draft_tokens.shape[0]:
        emitted[-1] = torch.multinomial(target_probs[accepted], 1, generator=generator)[0]
    return emitted, accepted


def accepts_all(draft_tokens, draft_probs, target_probs, generator):
    """Mutant: every drafted token is accepted; the bonus is drawn from p as usual."""
    k = draft_tokens.shape[0]
    return torch.cat([draft_tokens, torch.multinomial(target_probs[k], 1, generator=generator)]), k


def drops_bonus(draft_tokens, draft_probs, target_probs, generator):
    """Mutant: a fully accepted chain emits no bonus token. The loop then takes the last drafted token for
    the target's (a token its cache already holds), so the next token is drawn after a repeated token.
    (Dropping the bonus while keeping the caches right would be lossless, only slower.)"""
    emitted, accepted = verify_sampled(draft_tokens, draft_probs, target_probs, generator)
    return (emitted[:-1], accepted) if accepted == draft_tokens.shape[0] > 0 else (emitted, accepted)


@pytest.mark.parametrize("mutant", [resamples_from_p, accepts_all, drops_bonus], ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", ["lm", "eagle3"])
def test_broken_verifier_is_rejected(models, mode, mutant, monkeypatch):
    """The same samples-and-X^2 as `test_window_follows_target_law`, with the loops' verifier swapped for a
    broken one, must reject the target's law (p < 1e-4)."""
    for module in (draftwheel.serving.engine.decoding, draftwheel.serving.engine.eagle_decoding, draftwheel.serving.engine.suffix_decoding):
        monkeypatch.setattr(module, "verify_sampled", mutant)
    engine, engine_mode = make_engine(models, mode)
    result = law_test(models, sample(engine, engine_mode, HOT, N), HOT)
    print(f"{mode} {mutant.__name__}: {result}")
    assert result.pvalue < 1e-4, result


@pytest.mark.parametrize("mode", MODES)
def test_long_runs_draft_up_to_k_inside_support(models, mode):
    """40-token sampled runs at k=5: steps draft several tokens (5 at the fixed k of lm, eagle3 and medusa;
    the chain cut shortens eagle3's chains; the suffix index proposes what it has, past k too), and every
    emitted token lies in the target's warped support given its prefix."""
    engine, engine_mode = make_engine(models, mode)
    params = SamplingParams(max_new_tokens=40, temperature=1.0, top_k=4, top_p=0.9, k=5)
    drafted = Counter()
    for prompt in PROMPTS[:3]:
        for completion in sample(engine, engine_mode, params, 2, prompt):
            assert_in_support(models.oracle, completion.prompt_token_ids, completion.token_ids, params)
            drafted.update(s.k for s in completion.record.steps)
    print(f"{mode} long runs: drafted per step {dict(sorted(drafted.items()))}")
    assert max(drafted) >= 2, drafted
    if mode in ("lm", "eagle3", "medusa"):
        assert drafted[5] > 0, drafted


def test_chi_square_pools_tiny_cells_and_counts_samples_outside_support():
    law = {("a",): 0.5, ("b",): 0.49, ("c",): 0.01}
    exact = [("a",)] * 50 + [("b",)] * 49 + [("c",)]
    result = chi_square(exact, law)
    # c expects 1 of 100: pooled, and the pool takes b (the smallest kept cell) to expect >= 5.
    assert (result.dof, result.pooled_cells, result.outside_support) == (1, 2, 0) and result.pvalue > 0.99
    off = chi_square([("a",)] * 40 + [("z",)] * 10 + [("b",)] * 50, law)
    assert off.outside_support == 10 and off.pvalue < 0.05  # the z's land in the pooled bin
