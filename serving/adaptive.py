"""Adaptive speculation length: pick k per verification step from measured acceptance and cost.

With per-token acceptance probability a and draft/target cost ratio c, one step that drafts k tokens
emits on average E(k) = (1 - a^(k+1)) / (1 - a) tokens and costs (1 + k*c) target-forward units
(Leviathan et al. 2023, eq. 1 and thm 3.8). The controller chooses k in 1..k_max maximising
E(k) / (1 + k*c). Pure Python, no torch: testable on its own.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import Callable, Hashable


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens emitted by one step with k drafts, bonus/correction token included."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def index_beats_draft(score: float, a: float, k: int, n_index: int = 0, c: float = 0.0,
                      row_cost: Callable[[int], float] | None = None) -> bool:
    """The hybrid's rule: verify the suffix index's proposal when it promises more tokens per unit of cost
    than the draft's chain. The index's step emits 1 + `score` tokens (its estimated accepted length,
    calibrated by `ScoreCalibration`) for a verify over n_index + 1 rows; the draft's emits E(a, k) for a
    verify over k + 1 rows plus k draft tokens at `c` each (in units of a 1-row step; `row_cost(rows)`,
    e.g. `VerifyClock.cost`). With c = 0 and rows free this is score > E(a, k) - 1: equal accepted lengths
    go to the draft only when it costs nothing more, which on a CPU it never does (a round whose draft
    learned what the index already copied made the hybrid pick the draft and pay c for the same tokens)."""
    rows = row_cost or (lambda n: 1.0)
    return (1.0 + score) / rows(n_index + 1) > expected_tokens(a, k) / (rows(k + 1) + k * c)


def suffix_drafts(score: float, match_len: int, draft_pays: bool, a: float, k: int, n_index: int = 0,
                  c: float = 0.0, row_cost: Callable[[int], float] | None = None) -> bool:
    """The hybrid's choice for a step that has an index proposal: verify it rather than the draft
    model's? Always when drafting with the model does not pay (the proposal then replaces a plain step);
    otherwise when it promises more tokens per unit of cost (`index_beats_draft`), except on a one-token
    match: the request's own part proposes after a single shared token (serving.suffix,
    `request_min_match`), evidence good enough to beat a plain step but not a draft that pays."""
    if not draft_pays:
        return True
    return match_len > 1 and index_beats_draft(score, a, k, n_index, c, row_cost)


class VerifyClock:
    """What a verify forward over n rows costs relative to a 1-row step on this machine, fitted online:
    seconds = t0 + t1 * (rows - 1) by discounted least squares over the verify forwards seen, so
    cost(rows) = 1 + (t1 / t0) (rows - 1). Until the forwards seen span at least two row counts (or when
    the fit is degenerate) the slope is `prior_slope` (an AMX Xeon in bfloat16 measures ~0.04, an AVX2
    EPYC in float32 ~0.12). Pure Python."""

    def __init__(self, prior_slope: float = 0.05, decay: float = 0.98):
        self.prior_slope, self.decay = prior_slope, decay
        self._sums = [0.0] * 5  # discounted n, sum x, sum y, sum xx, sum xy (x = rows - 1, y = seconds)

    def observe(self, rows: int, seconds: float) -> None:
        x = rows - 1
        self._sums = [self.decay * old + new for old, new in zip(self._sums, (1.0, x, seconds, x * x, x * seconds))]

    @property
    def slope(self) -> float:
        n, sx, sy, sxx, sxy = self._sums
        spread = n * sxx - sx * sx
        if n < 2 or spread <= 1e-9 * max(n * sxx, 1e-12):
            return self.prior_slope
        t1 = (n * sxy - sx * sy) / spread
        t0 = (sy - t1 * sx) / n
        return min(max(t1 / t0, 0.0), 1.0) if t0 > 0 else self.prior_slope

    def cost(self, rows: int) -> float:
        return 1.0 + self.slope * (rows - 1)


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


class StepPace:
    """Whether drafting with the model pays in this request, by its own clock: seconds per emitted token
    of its draft steps (drafting + verify forward) against its plain steps (one target forward), both
    exponential moving averages weighted by tokens.

    Why: `speedup` prices a draft step at 1 + k*c target forwards, but on a CPU a verify forward also
    grows with its rows (~3 % of a step per row in bfloat16) and each draft step has fixed costs (the eagle3 draft first takes in the target's
    features of the confirmed tokens). At an acceptance of ~0.1 (the eagle3 v0 on sampled templated
    traffic) the draft alone ran at 0.91x plain decoding, and the hybrid
    drafted with it whenever the suffix index had nothing. The hybrid asks `draft_pays()` each step and
    otherwise verifies the index's proposal, or takes a plain step when there is none.

    The plain pace is measured by one plain step after `warmup` draft steps, and only when the draft
    emits fewer than `1 + margin` tokens per step (a draft that clearly pays never spends a step on the
    comparison). While plain steps win, a draft step explores after `explore` skipped steps, so a draft
    that recovers is noticed; each exploration that finds plain steps still winning doubles that wait,
    up to `max_explore` (on templated traffic at temperature 0.7 the eagle3 v0's explorations accepted
    ~9 % of their tokens: each one cost more than the step it replaced). An exploring step drafts at
    most `explore_k` tokens (`cap`): its question is whether the draft's first token now lands, and on a
    CPU where each verify row costs 15-27 % of a step (the AVX2 VM) a full-k exploration that fails
    costs two steps; at k = 1 it costs about a third of one. A draft that pays at k = 1 is back to
    drafting at full k from the next step. Explorations that cheap can wait up to `max_explore` = 64
    skipped steps (was 32): the pace outlives the request (`PaceMemory`), so that is one or two requests
    of a slice.

    One `StepPace` follows one (slice, draft) pair across requests (`PaceMemory`), so a new request
    starts from what the last one measured instead of paying the warm-up again.
    """

    def __init__(self, warmup: int = 3, explore: int = 8, decay: float = 0.8, margin: float = 0.25,
                 max_explore: int = 64, explore_k: int = 1):
        self.warmup, self.explore, self.decay, self.margin = warmup, explore, decay, margin
        self.max_explore, self.explore_k = max_explore, explore_k
        self.wait = explore  # skipped steps before the next exploring draft step
        self.exploring = False  # the last `draft_pays` said yes only to explore
        self._draft = [0.0, 0.0, 0.0]  # discounted seconds, tokens and steps of draft steps
        self._plain = [0.0, 0.0]  # discounted seconds and tokens (= steps) of plain steps
        self.draft_steps = 0
        self.skipped = 0  # "no" answers since `draft_pays` last said yes (the step may then still go to the index)
        self.clock = VerifyClock()  # verify cost by rows, for the hybrid's index-or-draft choice

    def draft_pays(self) -> bool:
        """Draft with the model this step? A "no" counts as a skipped step (for exploration)."""
        seconds, tokens, steps = self._draft
        self.exploring = False
        if self.draft_steps < self.warmup:
            pays = True
        elif not self._plain[1]:  # no plain step measured: take one only when the draft looks marginal
            pays = tokens / steps > 1.0 + self.margin
        elif seconds / tokens <= self._plain[0] / self._plain[1]:
            pays, self.wait = True, self.explore
        else:
            pays = self.exploring = self.skipped >= self.wait
            if pays:  # an exploring step; if plain steps still win after it, the next one waits longer
                self.wait = min(2 * self.wait, self.max_explore)
        self.skipped = 0 if pays else self.skipped + 1
        return pays

    def cap(self, k: int) -> int:
        """The draft length for this step: at most `explore_k` on an exploring step, else k."""
        return min(k, self.explore_k) if self.exploring else k

    def drafted(self, seconds: float, tokens: int) -> None:
        """A draft step took `seconds` (drafting + verify forward) and emitted `tokens`."""
        self._draft = [self.decay * old + new for old, new in zip(self._draft, (seconds, tokens, 1))]
        self.draft_steps += 1

    def plain(self, seconds: float) -> None:
        """A plain step (one target forward, one token) took `seconds`."""
        self._plain = [self.decay * old + new for old, new in zip(self._plain, (seconds, 1))]


class PaceMemory:
    """The hybrid's `StepPace` per (slice, draft), carried from one request to the next: each request
    starts from a copy of the last finished one's (`resume`) and leaves its own (`keep`). A new draft
    (champion change) has a new key, so it starts fresh. Holds the `max_keys` most recently kept.
    `factory` builds a fresh pace (default `StepPace()`; another factory tries other pace settings)."""

    def __init__(self, max_keys: int = 256, factory: Callable[[], StepPace] | None = None):
        self.max_keys = max_keys
        self.factory = factory or StepPace
        self._paces: OrderedDict[Hashable, StepPace] = OrderedDict()
        self._lock = threading.Lock()

    def resume(self, key: Hashable) -> StepPace:
        with self._lock:
            last = self._paces.get(key)
            return copy.deepcopy(last) if last is not None else self.factory()

    def keep(self, key: Hashable, pace: StepPace) -> None:
        with self._lock:
            self._paces[key] = pace
            self._paces.move_to_end(key)
            while len(self._paces) > self.max_keys:
                self._paces.popitem(last=False)

    def __len__(self) -> int:
        return len(self._paces)


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
