"""Adaptive speculation length: pick k per verification step from measured acceptance and cost.

With per-token acceptance probability a and draft/target cost ratio c, one step that drafts k tokens
emits on average E(k) = (1 - a^(k+1)) / (1 - a) tokens and costs (1 + k*c) target-forward units
(Leviathan et al. 2023, eq. 1 and thm 3.8). The controller chooses k in 1..k_max maximising
E(k) / (1 + k*c). Pure Python, no torch: testable on its own.
"""

from __future__ import annotations

import copy
import random
import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence


PRIOR_ROW_SLOPE = 0.05
"""A verify row's cost in 1-row steps before any is measured (`VerifyClock`)."""


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
    model's? When drafting with the model does not pay, the proposal competes with a plain step (one
    token for one unit): it is verified when its 1 + `score` tokens beat its verify rows' cost. Otherwise
    when it promises more tokens per unit of cost than the draft (`index_beats_draft`), except on a
    one-token match: the request's own part proposes after a single shared token (draftwheel.serving.engine.suffix,
    `request_min_match`), evidence good enough to beat a plain step but not a draft that pays."""
    if not draft_pays:
        return (1.0 + score) / (row_cost or (lambda n: 1.0))(n_index + 1) > 1.0
    return match_len > 1 and index_beats_draft(score, a, k, n_index, c, row_cost)


def tree_beats_index(score: float, first_prob: float, a: float, k: int, n_index: int, c: float = 0.0,
                     row_cost: Callable[[int], float] | None = None) -> bool:
    """Where the hybrid would verify the index's proposal alone: draft too, and verify both as one token
    tree? The tree emits on average 1 + `score` + (1 - `first_prob`) (E(a, k) - 1) tokens: the index's
    accepted length, plus the draft's where the index's first token fails (where the two part later, the
    longer wins, which this leaves out, so it errs towards the index alone); it costs verify rows for
    both and k draft tokens at `c` (units as in `index_beats_draft`). `score` and `first_prob` are
    calibrated (`ScoreCalibration`)."""
    rows = row_cost or (lambda n: 1.0)
    both = 1.0 + score + (1.0 - first_prob) * (expected_tokens(a, k) - 1.0)
    return both / (rows(n_index + k + 1) + k * c) > (1.0 + score) / rows(n_index + 1)


def branch_length(probs: Sequence[float], ratio: float, row_slope: float, rate: float, a: float = 0.0) -> int:
    """How many of an index proposal's tokens to verify beside the draft's chain, as a second branch of
    one token tree (draftwheel.serving.engine.tree). Each token adds one verify row, `row_slope` of a
    1-row step (`VerifyClock.slope`), and adds a token only where the branch is accepted that far and
    the chain is not: its calibrated chance, `ratio` (the request's `ScoreCalibration.ratio`) times its
    path probability, times the chance 1 - `a` that the draft's token there is wrong (`a`: the draft's
    per-token acceptance). A token is kept while that beats what its row would earn at the draft step's
    own rate (`rate` tokens per unit), so the branch never lowers what a draft step yields per unit;
    path probabilities only fall, so no later token would."""
    n = 0
    for prob in probs:
        if ratio * prob * (1.0 - a) < row_slope * rate:
            break
        n += 1
    return n


def runner_up_pays(odds: "ScoreCalibration", prob: float, row_slope: float, rate: float = 1.0) -> bool:
    """Verify the draft's runner-up first token beside its chain? It adds one verify row, `row_slope` of a
    1-row step, and one token where it comes true: its probability `prob` calibrated by how often it has
    (`odds`). Worth it when that beats what the row would earn at the draft step's own `rate` (tokens per
    unit; 1.0, a plain step's, where no pace measures it)."""
    return odds.scaled(prob) >= row_slope * rate


def stretch_length(probs: Sequence[float], ratio: float, row_slope: float, tokens: float, rows: int) -> int:
    """How many of an index proposal's stretch tokens (draftwheel.serving.engine.suffix.Proposal.stretch:
    past the cap its match length sets) to verify after its tokens. The step without them emits `tokens`
    on average (1 + its calibrated score) over a verify of `rows` rows. A stretch token adds one row,
    `row_slope` of a 1-row step (`VerifyClock.slope`), and on average `ratio` (how far stretch tokens
    came true in this request, a `ScoreCalibration`) times its path probability; it is kept while that
    beats what the step earns per unit so far, so each kept token raises the step's tokens per unit.
    Path probabilities only fall, so no later token would pay."""
    n = 0
    for prob in probs:
        gain = ratio * prob
        if gain < row_slope * tokens / (1.0 + row_slope * (rows - 1)):
            break
        tokens, rows, n = tokens + gain, rows + 1, n + 1
    return n


def stretch_calibration() -> "ScoreCalibration":
    """A request's evidence on stretch tokens: a prior of half the path probability's worth (the cap
    exists because a short match's probabilities run high), discounted more slowly than the score's
    calibration because stretch tokens are fewer."""
    return ScoreCalibration(prior_ratio=0.5, prior_weight=4.0, decay=0.95)


def index_stretch(proposal: Any, calibration: "ScoreCalibration", stretch: "ScoreCalibration", row_slope: float) -> int:
    """How many stretch tokens to verify after an index `proposal` (suffix.Proposal) the loop verifies
    alone: `stretch_length` with the request's score calibration (what the step earns without them) and
    stretch calibration (`stretch_calibration`)."""
    return stretch_length(proposal.stretch_probs, stretch.ratio, row_slope, 1.0 + calibration.scaled(proposal.score),
                          len(proposal.tokens) + 1)


def learn_index_step(proposal: Any, stretched: int, accepted: int, calibration: "ScoreCalibration",
                     stretch: "ScoreCalibration") -> None:
    """After verifying `proposal` with its first `stretched` stretch tokens, `accepted` tokens in all: its
    own tokens teach the score calibration, the stretch tokens the stretch calibration."""
    own = len(proposal.tokens)
    calibration.update(proposal.score, min(accepted, own))
    if stretched:
        stretch.update(sum(proposal.stretch_probs[:stretched]), max(accepted - own, 0))


class ModelledTime:
    """Step times from a fixed cost model instead of the clock, for measurements that compare settings:
    the hybrid's choices (`StepPace`, `VerifyClock`, the draft's c in `AdaptiveK`) read measured step
    times, so on a shared machine the same request decodes along other steps from one run to the next
    (as-served MAL moves by ±10 % over 12 prompts). With this, drafting takes `draft_c` per
    model-drafted token and a verify over n rows `row_costs[n - 1]` (the measured table,
    draftwheel.evaluation.served_cost.measure_row_costs; past its end, its last entry plus `row_slope`
    per further row), or without a table 1 + `row_slope` (n - 1), in units of a 1-row step (the
    draft's prompt intake is not priced): the choices become a function of the prompts alone. The
    table, not the line, is what serving's own `VerifyClock` learns, so a replay decides as serving
    would where the cost is not linear in the rows (a chain's few rows cost a step on a CPU, the
    index's long proposals more). The wall clock still times what a user would see. Pure Python."""

    def __init__(self, row_slope: float, draft_c: float, row_costs: list[float] | None = None):
        if row_slope < 0 or draft_c < 0:
            raise ValueError(f"row_slope and draft_c: must be >= 0, got {row_slope!r} and {draft_c!r}")
        if row_costs is not None and (not row_costs or min(row_costs) <= 0):
            raise ValueError(f"row_costs: must be positive costs of 1, 2, ... rows, got {row_costs!r}")
        self.row_slope, self.draft_c = row_slope, draft_c
        self.row_costs = list(row_costs) if row_costs is not None else None

    def verify(self, rows: int) -> float:
        """A verify forward over `rows` rows, in units of a 1-row step."""
        if self.row_costs is None:
            return 1.0 + self.row_slope * (rows - 1)
        table = self.row_costs
        return table[rows - 1] if rows <= len(table) else table[-1] + self.row_slope * (rows - len(table))

    def times(self, rows: int, model_drafted: int) -> tuple[float, float]:
        """(drafting, verify) of a step over `rows` verify rows with `model_drafted` model-drafted tokens."""
        return self.draft_c * model_drafted, self.verify(rows)


class _DiscountedLine:
    """y = a + b * x by least squares over observations discounted by `decay` each (the clocks below)."""

    def __init__(self, decay: float):
        self.decay = decay
        self._sums = [0.0] * 5  # discounted n, sum x, sum y, sum xx, sum xy

    def observe(self, x: float, y: float) -> None:
        self._sums = [self.decay * old + new for old, new in zip(self._sums, (1.0, x, y, x * x, x * y))]

    def relative_slope(self, prior: float) -> float:
        """b / a clamped to [0, 1]; `prior` until the observations span two x values (or a <= 0)."""
        n, sx, sy, sxx, sxy = self._sums
        spread = n * sxx - sx * sx
        if n < 2 or spread <= 1e-9 * max(n * sxx, 1e-12):
            return prior
        b = (n * sxy - sx * sy) / spread
        a = (sy - b * sx) / n
        return min(max(b / a, 0.0), 1.0) if a > 0 else prior


class VerifyClock:
    """What a verify forward over n rows costs relative to a 1-row step on this machine, measured online.

    `cost(rows)`: where both a 1-row forward and one over `rows` rows have been seen (`min_seen` times
    each), the ratio of their mean times (discounted by `decay` over each row count's own forwards);
    otherwise the line seconds = t0 + t1 * (rows - 1), fitted by discounted least squares over every
    forward seen, so cost(rows) = 1 + (t1 / t0) (rows - 1). `slope` (t1 / t0: what one more row adds,
    for the choices that weigh a single row) is `prior_slope` until the forwards span two row counts
    (an AMX Xeon in bfloat16 measures ~0.04, an AVX2 EPYC in float32 ~0.12).

    Why not the line alone: on a CPU the cost is not linear in the rows. On a 2-core EPYC (AVX-512 BF16,
    bfloat16) forwards of 2 to 5 rows took the same time (a lone row 0-25 % more) and from 8 rows
    on each row added ~5 %; the line, fitted mostly on the index's 17-row proposals, priced a chain's
    4-row verify ~12 % above a step, so a draft that paid read as marginal. Pure Python."""

    def __init__(self, prior_slope: float = PRIOR_ROW_SLOPE, decay: float = 0.98, min_seen: int = 2):
        self.prior_slope, self.decay, self.min_seen = prior_slope, decay, min_seen
        self._fit = _DiscountedLine(decay)  # x = rows - 1, y = seconds
        self._by_rows: dict[int, list[float]] = {}  # rows -> [forwards seen, discounted count, discounted seconds]

    def observe(self, rows: int, seconds: float) -> None:
        self._fit.observe(rows - 1, seconds)
        seen = self._by_rows.setdefault(rows, [0, 0.0, 0.0])
        seen[0], seen[1], seen[2] = seen[0] + 1, self.decay * seen[1] + 1.0, self.decay * seen[2] + seconds

    @property
    def slope(self) -> float:
        return self._fit.relative_slope(self.prior_slope)

    def _mean(self, rows: int) -> float | None:
        seen = self._by_rows.get(rows)
        return seen[2] / seen[1] if seen and seen[0] >= self.min_seen and seen[2] > 0 else None

    def cost(self, rows: int) -> float:
        one, these = self._mean(1), self._mean(rows)
        if one is not None and these is not None:
            return these / one
        return 1.0 + self.slope * (rows - 1)


class ForwardClock:
    """What a batched target forward costs by its tokens, fitted online: seconds = a + b * tokens by
    discounted least squares over the batch engine's forwards (prior b / a = `prior_ratio` until they
    span two token counts), and each row's share of one forward, `share`: the fixed part (the weights
    read once per forward) split evenly over the rows, the per-token part by the row's tokens, scaled so
    the shares add up to the forward's measured seconds. A row alone gets the whole forward, so the
    per-request policies above (VerifyClock, StepPace, AdaptiveK) see exactly what they see one request
    at a time; in a batch of B a plain row gets about a / B + b and a verify over k + 1 rows b * k more,
    while the row's own drafting time stays whole: the bigger the batch, the dearer a drafted token
    against the batch's own throughput, and the hybrid's pace turns to plain steps when drafting stops
    paying. Pure Python."""

    def __init__(self, prior_ratio: float = 0.05, decay: float = 0.98):
        self.prior_ratio = prior_ratio
        self._fit = _DiscountedLine(decay)  # x = tokens, y = seconds

    def observe(self, tokens: int, seconds: float) -> None:
        self._fit.observe(float(tokens), seconds)

    @property
    def ratio(self) -> float:
        """b / a: what one more token in a forward costs, relative to the forward's fixed part."""
        return self._fit.relative_slope(self.prior_ratio)

    def share(self, tokens: int, rows: int, total_tokens: int, seconds: float) -> float:
        """A row's seconds of a forward over `rows` rows and `total_tokens` tokens that took `seconds`."""
        r = self.ratio
        return seconds * (1.0 / rows + r * tokens) / (1.0 + r * total_tokens)


PLAIN, INDEX, ALL = "plain", "index", "all"
"""The batch engine's speculation regimes (`SpecGovernor`): every row on plain steps; the suffix index's
proposals only (no draft model); everything each row's own rules choose."""
REGIMES = (ALL, INDEX, PLAIN)  # in the order a new batch size measures them
TWO_REGIMES = (ALL, PLAIN)  # the default: the draft model and the index capped together


class SpecGovernor:
    """How much the rows of a batch may speculate, decided by what the batch emits: per batch size
    (buckets 2, 3-4, 5-8, ... rows), the tokens per second of spans of steps under each of its `regimes`
    (discounted sums over the spans of `span` steps measured, each span's seconds the whole step: forward,
    verification and the next drafts): `ALL` (the rows draft as their own rules choose) and `PLAIN`, and
    with `REGIMES` also `INDEX` (the draft model capped, the suffix index's proposals still verified where
    a row's rule prices them above a plain step). An index proposal costs verify rows but no drafting, so a
    load where drafting with the model loses may still gain from the index: SQL traffic its draft could
    not draft, served 4 at a time, emitted 3.39 tokens a step with `INDEX` against 2.38 without. On mixed
    traffic at 16 rows the third regime's evidence gathering and its noisier spans cost more than it
    brought (docs/results.md, "Serving under load"), so two is the default (`TWO_REGIMES`).

    Each span keeps the regime that emits most, except that another is tried now and then (and until each
    has `warmup` spans, `ALL` first), so a change in traffic is noticed: on one span in `1 / explore` while
    the best's rate is not told apart from every other's, on one in `1 / explore_clear` once it is (at
    least `clear_z` standard errors from each, from the spread of the spans' own rates). Exploring a loser
    costs what it loses on each span tried: at 16 rows drafting emits ~0.7 of plain's tokens per second on
    an AMX CPU, so one span in ten cost the batch ~3 % against batched plain decoding, paid for evidence that
    was already clear. A batch of one row is not governed (one request alone decides as `Engine` does).
    Pure Python; its draws use its own seeded generator."""

    def __init__(self, span: int = 4, explore: float = 0.1, explore_clear: float = 0.02, clear_z: float = 2.0,
                 warmup: int = 2, decay: float = 0.9, seed: int = 0, regimes: tuple[str, ...] = TWO_REGIMES):
        if not (ALL in regimes and PLAIN in regimes and set(regimes) <= set(REGIMES)):
            raise ValueError(f"regimes: need {ALL!r} and {PLAIN!r}, from {', '.join(REGIMES)}; got {regimes!r}")
        self.regimes = tuple(regime for regime in REGIMES if regime in regimes)
        if not 0.0 <= explore_clear <= explore <= 1.0:
            raise ValueError(f"explore_clear and explore: need 0 <= explore_clear <= explore <= 1, got "
                             f"{explore_clear!r} and {explore!r}")
        self.span, self.explore, self.explore_clear, self.clear_z = span, explore, explore_clear, clear_z
        self.warmup, self.decay = warmup, decay
        self._random = random.Random(seed)
        # (bucket, regime) -> spans, then discounted: tokens, seconds; weight, weight^2, sum of span rates, of their squares
        self._sums: dict[tuple[int, str], list[float]] = {}

    @staticmethod
    def bucket(rows: int) -> int:
        return (rows - 1).bit_length()  # 2 -> 1, 3-4 -> 2, 5-8 -> 3, ...

    def _of(self, rows: int, regime: str) -> list[float]:
        return self._sums.get((self.bucket(rows), regime), [0.0] * 7)

    def rate(self, rows: int, regime: str) -> float | None:
        """Tokens per second measured under `regime` at this batch size; None if unmeasured."""
        spans, tokens, seconds, *_ = self._of(rows, regime)
        return tokens / seconds if spans and seconds > 0 else None

    def standard_error(self, rows: int, regime: str) -> float:
        """Of `rate`: the discounted spread of the spans' own rates by their effective number (inf below two spans)."""
        spans, _, _, w, w2, total, squares = self._of(rows, regime)
        if spans < 2 or w2 <= 0:
            return float("inf")
        mean = total / w
        return (max(squares / w - mean * mean, 0.0) / (w * w / w2)) ** 0.5

    def best(self, rows: int) -> str:
        """The regime measured to emit most at this batch size (the first measured of `regimes` on a tie)."""
        measured = [regime for regime in self.regimes if self.rate(rows, regime) is not None]
        return max(measured, key=lambda regime: self.rate(rows, regime)) if measured else ALL

    def clear(self, rows: int) -> bool:
        """Is the best regime's rate at this batch size told apart (`clear_z` standard errors) from every other's?"""
        best = self.best(rows)
        for other in self.regimes:
            if other == best:
                continue
            if self.rate(rows, other) is None:
                return False
            error = (self.standard_error(rows, best) ** 2 + self.standard_error(rows, other) ** 2) ** 0.5
            if self.rate(rows, best) - self.rate(rows, other) < self.clear_z * error:
                return False
        return True

    def regime(self, rows: int) -> str:
        """The regime of the next span at this batch size."""
        if rows <= 1:
            return ALL
        for regime in self.regimes:  # measure each, drafting first
            if self._of(rows, regime)[0] < self.warmup:
                return regime
        best = self.best(rows)
        explore = self.explore_clear if self.clear(rows) else self.explore
        if self._random.random() < explore:
            return self._random.choice([regime for regime in self.regimes if regime != best])
        return best

    def observe(self, rows: int, regime: str, tokens: int, seconds: float) -> None:
        """One span of steps at about `rows` rows under `regime` emitted `tokens` in `seconds`."""
        if regime not in self.regimes:
            raise ValueError(f"regime: {regime!r} not one of {', '.join(self.regimes)}")
        sums = self._sums.setdefault((self.bucket(rows), regime), [0.0] * 7)
        d = self.decay
        span_rate = tokens / seconds if seconds > 0 else 0.0
        sums[:] = [sums[0] + 1.0, d * sums[1] + tokens, d * sums[2] + seconds, d * sums[3] + 1.0,
                   d * d * sums[4] + 1.0, d * sums[5] + span_rate, d * sums[6] + span_rate * span_rate]


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
    """Whether drafting with the model pays in this request: the tokens its draft steps emit per unit of
    cost, against a plain step's one token per unit (a unit is one 1-row target forward).

    A draft step over k+1 verify rows costs `clock.cost(k + 1) * (1 + draft_s / verify_s)` units: the
    verify forward's cost by rows (`VerifyClock`, fitted on this machine) and the drafting time as a
    share of that same step's verify time. Both times come from one step, so a change in machine load
    between steps scales them alike and cancels; no plain step is ever timed for the comparison (the
    wall-clock pace this replaces compared draft steps with plain steps taken at other moments, and on
    a marginal draft its answer flipped with the machine's load: the same champion measured 1.06x and
    1.22x plain on the same chat prompts).

    The decision weighs the evidence by its uncertainty (Thompson sampling): the draft's speed ratio
    r = tokens / units is estimated from discounted sums over its draft steps (a ratio estimator, with
    its standard error from the steps' spread and their effective number); each step draws r from
    N(r_hat, se^2) and drafts when the draw beats 1. A draft that clearly pays drafts on every step; one
    that clearly loses almost never; a marginal or little-measured one drafts on a share of steps that
    matches the odds it pays. Evidence ages: each step the draft sits out discounts it by `age_decay`,
    and the error never falls below `prior_se / sqrt(weight of evidence)`, so a draft shut out for long
    is tried again now and then (about one step in 30 for one whose every token is rejected), which is
    how a draft that recovers is noticed. The first `warmup` draft steps of a pace (a seed's included)
    always draft. The draws use the pace's own seeded generator, never the request's, so sampled output
    is unaffected.

    One `StepPace` follows one (slice, draft) pair at one load across requests (`LoadPaces`,
    `PaceMemory`), so a new request starts from what the last one measured instead of paying the warm-up
    again; a load not seen yet starts from another load's evidence (`seed_from`).
    """

    def __init__(self, warmup: int = 3, decay: float = 0.95, age_decay: float = 0.99, prior_se: float = 0.2,
                 seed: int = 0):
        self.warmup, self.decay, self.age_decay, self.prior_se = warmup, decay, age_decay, prior_se
        # discounted sums over draft steps: weight, weight^2, tokens, units, tokens^2, units^2, tokens*units
        self._sums = [0.0] * 7
        # ...and of each draft step's verify rows: rows, rows^2, tokens*rows (what `seed_from` prices)
        self._row_sums = [0.0] * 3
        self.draft_steps = 0  # measured here
        self.seed_steps = 0  # measured at another load, this pace's starting evidence (`seed_from`)
        self.clock = VerifyClock()  # verify cost by rows: the unit of every comparison here
        self._rng = random.Random(seed)

    @property
    def ratio(self) -> float:
        """The draft's emitted tokens per unit of cost (plain decoding: 1.0); 0 before any draft step."""
        _, _, tokens, units, *_ = self._sums
        return tokens / units if units else 0.0

    @property
    def standard_error(self) -> float:
        """Of `ratio`: the spread of tokens - ratio * units over the draft steps, by their effective number."""
        w, w2, tokens, units, tt, uu, tu = self._sums
        if not units or w2 <= 0:
            return float("inf")
        r = tokens / units
        spread = max(tt - 2 * r * tu + r * r * uu, 0.0) / w  # weighted mean squared residual per step
        effective = w * w / w2
        return max((spread / effective) ** 0.5 / (units / w), self.prior_se / w ** 0.5)

    @property
    def clearly_loses(self) -> bool:
        """Past the warm-up, is the draft's speed ratio below a plain step's by more than its standard
        error? Such a draft's draws still explore (that is how a recovery is noticed), but the hybrid
        lets an exploring step stand in for a plain step only, never for an index proposal that beats
        one: drafted in place of the index's copies, each exploring step of a draft whose tokens are
        nearly all rejected gave up the index's 3-6 tokens for one (code and templated traffic ran
        2-5 % below the index alone). A draft that is merely uncertain still competes everywhere, so
        its evidence is not drawn only from the positions the index cannot cover."""
        return not self.warming_up and self.ratio + self.standard_error < 1.0

    @property
    def warming_up(self) -> bool:
        return self.draft_steps + self.seed_steps < self.warmup

    def draft_pays(self) -> bool:
        """Draft with the model this step? A "no" ages the evidence."""
        pays = self.warming_up or self._rng.gauss(self.ratio, self.standard_error) > 1.0
        if not pays:  # the evidence ages: the ratio stays, its weight (and so its certainty) shrinks
            a = self.age_decay
            self._sums = [x * f for x, f in zip(self._sums, (a, a * a, a, a, a, a, a))]
            self._row_sums = [x * a for x in self._row_sums]
        return pays

    @property
    def evidence(self) -> float:
        """The discounted weight of the draft steps measured."""
        return self._sums[0]

    def seed_from(self, other: "StepPace") -> None:
        """Start from `other`'s evidence, measured at another load, priced for the best case at this one:
        each of its draft steps' tokens against its verify rows alone (by this pace's clock), the drafting
        counted free. The load moves what drafting costs against a verify, never the tokens a draft step
        emits, so a draft whose tokens do not pay even for their verify rows pays at no load, and needs no
        warm-up at this one to show it (`LoadPaces` seeds only then)."""
        w, w2, tokens, _, tt, _, _ = other._sums
        rows, rows2, token_rows = other._row_sums
        slope = self.clock.slope
        base = 1.0 - slope  # cost(r) = 1 + slope (r - 1) = base + slope r, so its sums follow the rows'
        units = base * w + slope * rows
        units2 = base * base * w + 2 * base * slope * rows + slope * slope * rows2
        self._sums = [w, w2, tokens, units, tt, units2, base * tokens + slope * token_rows]
        self._row_sums = list(other._row_sums)
        self.seed_steps = other.draft_steps + other.seed_steps

    def units(self, rows: int, draft_s: float, verify_s: float) -> float:
        """What a draft step cost, in 1-row target forwards (class docstring)."""
        return self.clock.cost(rows) * (1.0 + draft_s / max(verify_s, 1e-9))

    def drafted(self, tokens: int, rows: int, draft_s: float, verify_s: float) -> None:
        """A draft step emitted `tokens` from a verify over `rows` rows, after `draft_s` seconds drafting
        and `verify_s` verifying."""
        u = self.units(rows, draft_s, verify_s)
        d, d2 = self.decay, self.decay ** 2
        w, w2, t, un, tt, uu, tu = self._sums
        self._sums = [d * w + 1, d2 * w2 + 1, d * t + tokens, d * un + u, d * tt + tokens * tokens,
                      d * uu + u * u, d * tu + tokens * u]
        self._row_sums = [d * x + new for x, new in zip(self._row_sums, (rows, rows * rows, tokens * rows))]
        self.draft_steps += 1


class LoadPaces:
    """One (slice, draft)'s `StepPace` per load: one pace per batch-size bucket (`SpecGovernor.bucket`:
    a request alone, 2 rows, 3-4, 5-8, ...), chosen each step by the rows of the forward the request last
    took part in (`at`). Whether drafting pays depends on the load: in a batch of B a row's share of the
    verify forward shrinks (`ForwardClock`) while its drafting time stays whole, so a pace learned under
    batched traffic turns to plain steps that one request alone would have drafted through. One pace over
    all loads carried that verdict to the next lone request (chat as served fell below the draft alone).
    A load met for the first time starts from the best-measured other load's evidence, priced for the
    best case (`StepPace.seed_from`), when that evidence holds at least `min_seed_steps` draft steps and
    says, beyond its standard error, that drafting cannot pay; else it starts fresh and measures (an
    optimistic seed would hold a marginal draft in for many steps, the fresh pace's warm-up for three).
    Why the floor: a pessimistic seed shuts the draft out until its weight ages away, about a hundred
    steps, so it must stand on more than a warm-up's worth of steps. Chat served 4 at a time, whose
    batches the governor kept on plain steps, left its 3-4-row pace 3 warm-up steps; seeded from them,
    the next lone chat requests took 10 % plain steps (a fresh pace: 4 %, the draft paying 1.25 tokens
    a unit). `factory` builds each bucket's fresh pace."""

    def __init__(self, factory: Callable[[], StepPace] = StepPace, min_seed_steps: int = 10):
        self.factory, self.min_seed_steps = factory, min_seed_steps
        self._paces: dict[int, StepPace] = {}
        # how often the eagle3 draft's runner-up first token is the target's, against its probability: it
        # depends on the slice (a quarter of rejected first tokens on chat, few on code), not on the load
        self.sibling_odds = ScoreCalibration()

    def at(self, rows: int) -> StepPace:
        """The pace for a step at this batch size (rows of the last forward; 1 for a request alone)."""
        bucket = SpecGovernor.bucket(max(rows, 1))
        if bucket not in self._paces:
            pace = self.factory()
            measured = [other for other in self._paces.values() if other.draft_steps >= self.min_seed_steps]
            if measured:
                seeded = self.factory()
                seeded.seed_from(max(measured, key=lambda other: other.evidence))
                if seeded.ratio + seeded.standard_error < 1.0:  # cannot pay even with drafting free
                    pace = seeded
            self._paces[bucket] = pace
        return self._paces[bucket]

    @property
    def draft_steps(self) -> int:
        """Draft steps measured, over every load (a seed counts where it was measured)."""
        return sum(pace.draft_steps for pace in self._paces.values())


class PaceMemory:
    """The hybrid's `LoadPaces` per (slice, draft), carried from one request to the next: each request
    starts from a copy of the last finished one's (`resume`) and leaves its own (`keep`). A new draft
    (champion change) has a new key, so it starts fresh. Holds the `max_keys` most recently kept.
    `factory` builds a fresh pace for one load (default `StepPace()`; another factory tries other pace
    settings)."""

    def __init__(self, max_keys: int = 256, factory: Callable[[], StepPace] | None = None):
        self.max_keys = max_keys
        self.factory = factory or StepPace
        self._paces: OrderedDict[Hashable, LoadPaces] = OrderedDict()
        self._lock = threading.Lock()

    def resume(self, key: Hashable) -> LoadPaces:
        with self._lock:
            last = self._paces.get(key)
            return copy.deepcopy(last) if last is not None else LoadPaces(self.factory)

    def keep(self, key: Hashable, pace: LoadPaces) -> None:
        with self._lock:
            self._paces[key] = pace
            self._paces.move_to_end(key)
            while len(self._paces) > self.max_keys:
                self._paces.popitem(last=False)

    def copy(self) -> "PaceMemory":
        """An independent copy, every pace copied: a measurement starts where serving stands without
        moving it."""
        other = PaceMemory(self.max_keys, self.factory)
        with self._lock:
            other._paces = OrderedDict((key, copy.deepcopy(pace)) for key, pace in self._paces.items())
        return other

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
