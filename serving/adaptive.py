"""Adaptive speculation length: pick k per verification step from measured acceptance and cost.

With per-token acceptance probability a and draft/target cost ratio c, one step that drafts k tokens
emits on average E(k) = (1 - a^(k+1)) / (1 - a) tokens and costs (1 + k*c) target-forward units
(Leviathan et al. 2023, eq. 1 and thm 3.8). The controller chooses k in 1..k_max maximising
E(k) / (1 + k*c). Pure Python, no torch: testable on its own.
"""

from __future__ import annotations


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens emitted by one step with k drafts, bonus/correction token included."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def index_beats_draft(score: float, a: float, k: int) -> bool:
    """The hybrid's rule: verify the suffix index's proposal when its score (its estimated accepted
    length, calibrated by `ScoreCalibration`) beats the draft's expected accepted length at k, E(a, k) - 1."""
    return score > expected_tokens(a, k) - 1


class ScoreCalibration:
    """How far the suffix index's scores come true in one request: accepted tokens per unit of score
    over its verified proposals, discounted by `decay` per proposal, with a prior that trusts the score
    (ratio `prior_ratio`, worth `prior_weight` units of score).

    Why: a score sums branch frequencies, and a context matched once scores its whole continuation
    as certain. On templated traffic that is right; on chat such matches mostly fail at the first
    token, and every failed 16-token verify costs a step the draft would have used. The hybrid compares
    `scaled(score)` with the draft's expectation, so an index that keeps over-promising in a request
    stops being chosen there, while one whose scores come true keeps its full weight.
    """

    def __init__(self, prior_ratio: float = 1.0, prior_weight: float = 4.0, decay: float = 0.9):
        self.accepted = prior_ratio * prior_weight
        self.promised = prior_weight
        self.decay = decay

    @property
    def ratio(self) -> float:
        return self.accepted / self.promised

    def scaled(self, score: float) -> float:
        return score * self.ratio

    def update(self, score: float, accepted: int) -> None:
        self.accepted = self.decay * self.accepted + accepted
        self.promised = self.decay * self.promised + score


def speedup(a: float, k: int, c: float) -> float:
    """Expected tokens per unit of target-forward time, relative to plain decoding."""
    return expected_tokens(a, k) / (1.0 + k * c)


def best_k(a: float, c: float, k_max: int) -> int:
    return max(range(1, k_max + 1), key=lambda k: speedup(a, k, c))


class AdaptiveK:
    """Per-request controller.

    Acceptance estimate: each step with k drafts and j accepted is j successes followed by one failure
    when j < k (geometric model), so a = successes / (successes + failures), the maximum-likelihood
    estimate, discounted by `decay` per step so it follows drift. A prior worth `prior_weight` drafted
    tokens at `prior_a` keeps the first steps sane. The cost ratio is an exponential moving average of
    per-step (mean draft forward time) / (target verify forward time).
    """

    def __init__(self, k_max: int, prior_a: float = 0.7, prior_weight: float = 4.0, decay: float = 0.9,
                 prior_c: float = 0.2):
        self.k_max = k_max
        self.decay = decay
        self.successes = prior_a * prior_weight
        self.failures = (1.0 - prior_a) * prior_weight
        self.c = prior_c
        self._c_measured = False

    @property
    def a(self) -> float:
        return self.successes / (self.successes + self.failures)

    def next_k(self) -> int:
        return best_k(min(self.a, 0.999), self.c, self.k_max)

    def update(self, k: int, accepted: int, draft_s: float, target_s: float) -> None:
        self.successes = self.decay * self.successes + accepted
        self.failures = self.decay * self.failures + (1 if accepted < k else 0)
        if k > 0 and target_s > 0:
            ratio = (draft_s / k) / target_s
            self.c = ratio if not self._c_measured else 0.8 * self.c + 0.2 * ratio
            self._c_measured = True
