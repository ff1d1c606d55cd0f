"""Verification functions on hand-built probabilities: the accept and reject paths and the output law.

The statistical tests use Pearson's chi-square goodness-of-fit statistic
    X^2 = sum_over_cells (observed - expected)^2 / expected,
which under the null hypothesis (the samples follow the expected law) is approximately chi-square
distributed with (cells - 1) degrees of freedom. Sampling is seeded, so each test is deterministic; we
require p > 0.001 for the correct law, and as a control show that the same statistic rejects
(p < 1e-6) the draft's law, so the test has the power to fail.
"""

import torch
from scipy.stats import chisquare

from draftwheel.serving.engine.verify import verify_greedy, verify_sampled


def _logits_with_argmax(tokens, vocab=5):
    logits = torch.zeros(len(tokens), vocab)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


def test_greedy_all_accepted_emits_bonus():
    emitted, accepted = verify_greedy(torch.tensor([1, 2, 3]), _logits_with_argmax([1, 2, 3, 4]))
    assert accepted == 3
    assert emitted.tolist() == [1, 2, 3, 4]


def test_greedy_first_mismatch_emits_target_token():
    emitted, accepted = verify_greedy(torch.tensor([1, 0, 3]), _logits_with_argmax([1, 2, 3, 4]))
    assert accepted == 1
    assert emitted.tolist() == [1, 2]  # later agreement (position 2) must not count


def test_greedy_rejects_at_first_position():
    emitted, accepted = verify_greedy(torch.tensor([0]), _logits_with_argmax([4, 1]))
    assert (emitted.tolist(), accepted) == ([4], 0)


def test_sampled_accepts_when_target_puts_more_mass():
    # p(x) >= q(x) for every drafted token: acceptance probability min(1, p/q) = 1.
    q = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    p = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    emitted, accepted = verify_sampled(torch.tensor([1, 0]), q, p, torch.Generator().manual_seed(0))
    assert accepted == 2
    assert emitted.tolist() == [1, 0, 2]  # bonus from p[2], which is a point mass on 2


def test_sampled_rejects_token_target_never_emits_and_uses_residual():
    # p(x)=0 -> always rejected; the residual max(0, p - q) is a point mass on token 2.
    q = torch.tensor([[0.0, 1.0, 0.0]])
    p = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    for seed in range(20):
        emitted, accepted = verify_sampled(torch.tensor([1]), q, p, torch.Generator().manual_seed(seed))
        assert (emitted.tolist(), accepted) == ([2], 0)


def test_residual_distribution_is_normalised_positive_part():
    # p = [.5,.3,.2], q = [.2,.6,.2]: max(0, p-q) = [.3,0,0] -> after a rejection the token is always 0.
    q = torch.tensor([[0.2, 0.6, 0.2]])
    p = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]])
    corrections = set()
    for seed in range(200):
        emitted, accepted = verify_sampled(torch.tensor([1]), q, p, torch.Generator().manual_seed(seed))
        if accepted == 0:
            corrections.add(int(emitted[0]))
    assert corrections == {0}


def _first_token_counts(p, q, n, seed=0):
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[-1])
    for _ in range(n):
        drafted = torch.multinomial(q[0], 1, generator=generator)
        emitted, _ = verify_sampled(drafted, q, p, generator)
        counts[emitted[0]] += 1
    return counts


def test_sampled_first_token_follows_target_distribution():
    p = torch.tensor([[0.1, 0.4, 0.3, 0.15, 0.05], [0.2] * 5])
    q = torch.tensor([[0.4, 0.1, 0.2, 0.1, 0.2]])
    n = 4000
    counts = _first_token_counts(p, q, n)
    assert chisquare(counts.numpy(), (p[0] * n).numpy()).pvalue > 1e-3
    # Control: the same samples are far from the draft's law, so the statistic can reject.
    assert chisquare(counts.numpy(), (q[0] * n).numpy()).pvalue < 1e-6


def test_sampled_two_token_joint_follows_target():
    """With k=2 the pair (first, second) emitted tokens must follow p0(a) * p1(b) when p1 does not
    depend on a (hand-built: the target's second-position law is fixed), 4x4 = 16 cells, 15 dof."""
    p = torch.tensor([[0.1, 0.5, 0.3, 0.1], [0.25, 0.25, 0.4, 0.1], [0.7, 0.1, 0.1, 0.1]])
    q = torch.tensor([[0.4, 0.2, 0.2, 0.2], [0.1, 0.6, 0.2, 0.1]])
    generator = torch.Generator().manual_seed(1)
    n = 4000
    counts = torch.zeros(4, 4)
    for _ in range(n):
        drafted = torch.stack([torch.multinomial(q[i], 1, generator=generator)[0] for i in range(2)])
        emitted, accepted = verify_sampled(drafted, q, p, generator)
        if len(emitted) < 2:  # rejected at position 0: draw the next token from the target, as the engine would
            emitted = torch.cat([emitted, torch.multinomial(p[1], 1, generator=generator)])
        counts[emitted[0], emitted[1]] += 1
    expected = (p[0][:, None] * p[1][None, :]) * n
    assert chisquare(counts.flatten().numpy(), expected.flatten().numpy()).pvalue > 1e-3
