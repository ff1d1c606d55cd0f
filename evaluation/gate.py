"""The shadow gate: statistics and the promote/reject decision over a shadow report.

`summarize(requests, config)` turns per-request figures (champion and challenger on the same prompts)
into overall and per-slice means with paired-bootstrap intervals; `gate(report, config)` decides. All
intervals come from one paired bootstrap per group of requests: resample requests (both arms together)
with replacement, `bootstrap_resamples` times, seeded; take percentiles at `confidence`, widened for
small samples (`small_sample_widening`: Student-t tails and the unbiased variance).

The gated figure is `config.metric`: by default `served_speedup`, each request's modelled speed against
plain decoding as served (draftwheel.evaluation.served_cost: tokens per unit of measured verify cost and draft cost),
which moves with the as-served mean accepted length and with what each step costs; or
`mean_accepted_length` (tokens per target verification step). Both, the wall clock and the draft-alone
figures are reported beside it; the wall clock vetoes only on decisive evidence (its whole interval a
loss beyond `wall_tolerance`), so timing noise cannot decide alone.

- Overall gain: the interval of the mean per-request difference in the metric. Pairing removes the
  prompt-to-prompt variance both drafts share.
- Per slice, non-inferiority: the interval of the relative change of the slice's mean, (mean
  challenger / mean champion) - 1, a ratio of means. A slice with at least `min_slice_requests`
  requests must have its lower bound above -tolerance: the data must show it did not lose more than
  the tolerance. A smaller slice is reported and pooled with the other small slices; a small slice or
  pool vetoes only on decisive evidence, its *upper* bound below -tolerance (the whole interval is a
  loss beyond the tolerance), and needs `MIN_EVIDENCE` requests for even that. The pool is gated by
  the rule its own size calls for. docs/registry.md works an example through.

`plot_slices` draws champion vs challenger per slice. This module runs no models and does no I/O
except saving the figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from draftwheel.serving.engine.precision import check_dtype_name
from draftwheel.serving.engine.records import add_counts, describe_shares, source_shares

METRIC = "mean_accepted_length"
SERVED_SPEEDUP = "served_speedup"
METRICS = (SERVED_SPEEDUP, METRIC)
REPORTED = ("mean_accepted_length", "served_speedup", "acceptance_rate", "tokens_per_s")
"""Figures averaged per arm in every summary, whatever the gated metric (draft-alone ones too, when replayed)."""
POOLED = "other/pooled"
"""Name of the gating group made of the slices with fewer than `min_slice_requests` requests."""
MIN_EVIDENCE = 3
"""Fewest requests with which a small slice or pool may veto: with 1 the bootstrap interval is a point,
with 2 its ends are the two requests themselves, so neither says anything about spread."""
NON_INFERIORITY, CLEAR_REGRESSION, TOO_FEW = "non-inferiority", "clear regression", "too few to judge"


@dataclass
class ShadowConfig:
    """Settings of `draftwheel shadow` (configs/shadow.yaml)."""

    metric: str = SERVED_SPEEDUP
    """The gated per-request figure: `served_speedup` (modelled speed vs plain decoding as served,
    draftwheel.evaluation.served_cost) or `mean_accepted_length`."""
    min_gain: float = 0.0
    """Promote only if the lower CI bound of the mean per-request gain in `metric` exceeds this."""
    confidence: float = 0.95
    """Two-sided confidence level of the bootstrap intervals (a bound is the end of that interval)."""
    bootstrap_resamples: int = 2000
    """Bootstrap resamples (numpy, seeded by bootstrap_seed, so a report is reproducible)."""
    bootstrap_seed: int = 0
    """Seed of the bootstrap resampling."""
    slice_tolerance: float = 0.05
    """Largest allowed relative drop of a slice's mean accepted length (0.05 = 5 %), judged on its CI."""
    slice_tolerances: dict[str, float] = field(default_factory=dict)
    """Per-slice overrides of slice_tolerance, e.g. {code: 0.02}; the pooled group uses slice_tolerance."""
    min_slice_requests: int = 10
    """A slice with fewer replayed requests is pooled and vetoes only on a clear regression."""
    min_requests: int = 8
    """Fewer replayed requests than this is not evidence: the gate rejects."""
    max_requests: int = 0
    """Replay at most this many holdout requests (0 = all), taken in holdout order."""
    include_canary: bool = True
    """Also replay the fixed canary prompt set."""
    canary_path: str = ""
    """Canary JSONL ({id, prompt, slice, max_new_tokens}); empty = the repo's configs/canary.jsonl."""
    max_new_tokens: int = 0
    """Tokens per request; 0 = each holdout row's own max_new_tokens."""
    temperature: float = 0.0
    """Sampling temperature of the measured replays (losslessness is always checked greedily)."""
    seed: int = 0
    """Request i uses seed + i, identical for champion and challenger."""
    k: int = 4
    """Draft tokens per verification step (at most, with min_path_prob)."""
    min_path_prob: float = 0.25
    """eagle3 drafts: stop a chain once the draft's own probability of it falls below this, as serving's
    `min_path_prob` (configs/serve.yaml) does: the gate measures the chains serving will draft."""
    dtype: str = "auto"
    """Replay precision, as serving's `dtype` (draftwheel.serving.engine.precision): auto = bfloat16 on CPUs with AMX-BF16 or AVX-512 BF16."""
    suffix_tier: bool = True
    """Replay both drafts as `draftwheel serve` runs them with its default `suffix_tier`: mode hybrid, beside
    the suffix index serving had (draftwheel.evaluation.shadow.served_index: the serving logs less the replayed prompts),
    read-only. False: mode draft (the draft alone). Either draft kind (`lm` or `eagle3`)."""
    suffix_logs: str = ""
    """Serving logs the suffix index is built from ("" = the state dir's logs/)."""
    draft_alone: bool = True
    """With suffix_tier, also replay each draft alone (mode draft): reported beside, never gated on."""
    modelled_time: bool = True
    """True: the hybrid's choices in the replay read step times from the cost model the gate prices by
    (the verify cost by rows measured before the replay, each draft's c from one draft-alone warm-up
    request timed against that request's own verify forwards: draftwheel.serving.engine.adaptive.ModelledTime)
    instead of the clock, so both drafts' replays differ by the drafts alone, not by the machine's load
    at each step; the wall clock is still measured and reported. False: the choices follow the clock, as
    in serving."""
    wall_tolerance: float = 0.10
    """The wall clock (tokens/s) vetoes a promotion only when the upper bound of its relative change is
    below -wall_tolerance: a loss shown beyond timing noise."""
    workers: int = 0
    """Replay processes, each with the target and both drafts (loaded from their directories): 1 = in this
    process; 0 = auto: one per CPU core, at most 4, from 16 requests on
    (draftwheel.evaluation.shadow.replay_workers). The draft alone: each process takes the next request as
    it finishes one. As served (suffix_tier): each takes a whole slice, in request order (the hybrid's step
    pace carries from one request of a slice to the next, as in serving), so never more processes than
    slices, and only with modelled_time (the choices must not read a clock the processes share). The
    figures are those of one process; the timings differ. One-request decoding is latency-bound, so two
    single-thread processes replay ~1.3x faster than one process with two threads."""

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence: must be in (0, 1), got {self.confidence!r}")
        if self.bootstrap_resamples < 100:
            raise ValueError(f"bootstrap_resamples: must be >= 100, got {self.bootstrap_resamples!r}")
        for name, value in {"slice_tolerance": self.slice_tolerance, **{
                f"slice_tolerances.{k}": v for k, v in self.slice_tolerances.items()}}.items():
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name}: must be a fraction in [0, 1), got {value!r}")
        for name in ("min_requests", "max_requests", "max_new_tokens", "workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if self.min_requests < 2:
            raise ValueError(f"min_requests: a bootstrap needs at least 2 requests, got {self.min_requests!r}")
        if self.min_slice_requests < MIN_EVIDENCE:
            raise ValueError(f"min_slice_requests: must be >= {MIN_EVIDENCE}, got {self.min_slice_requests!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature: must be in [0, 100], got {self.temperature!r}")
        if not 1 <= self.k <= 32:
            raise ValueError(f"k: must be in 1..32, got {self.k!r}")
        if not 0.0 <= self.min_path_prob < 1.0:
            raise ValueError(f"min_path_prob: must be in [0, 1), got {self.min_path_prob!r}")
        check_dtype_name(self.dtype)
        if self.metric not in METRICS:
            raise ValueError(f"metric: must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if not 0.0 <= self.wall_tolerance < 1.0:
            raise ValueError(f"wall_tolerance: must be a fraction in [0, 1), got {self.wall_tolerance!r}")
        if self.suffix_tier and not self.modelled_time and self.workers > 1:
            raise ValueError(f"workers: with suffix_tier and the choices on the clock (modelled_time false) the "
                             f"replay runs in one process, got {self.workers!r}; use 1 or 0 (auto)")

    def tolerance(self, slice_name: str) -> float:
        return float(self.slice_tolerances.get(slice_name, self.slice_tolerance))


@dataclass
class SliceVerdict:
    """One row of the gate's per-slice table: a slice, or the pool of small slices."""

    group: str
    members: list[str]
    n: int
    rule: str
    """NON_INFERIORITY (n >= min_slice_requests), CLEAR_REGRESSION (smaller), TOO_FEW (< MIN_EVIDENCE)."""
    tolerance: float
    metric: str
    champion_mean: float
    challenger_mean: float
    relative_change: float
    ci_low: float
    ci_high: float
    ok: bool

    def describe(self, confidence: float) -> str:
        name = f"slice {self.group!r}" if self.group != POOLED else f"{POOLED} ({', '.join(self.members)})"
        bound = {NON_INFERIORITY: f"lower bound must stay above -{self.tolerance:.0%}",
                 CLEAR_REGRESSION: f"pooled; vetoes only if the upper bound is below -{self.tolerance:.0%}",
                 TOO_FEW: f"pooled; fewer than {MIN_EVIDENCE} requests never veto"}[self.rule]
        return (f"{name} n={self.n}: {self.metric.replace('_', ' ')} {self.champion_mean:.4f} -> {self.challenger_mean:.4f}, "
                f"relative {self.relative_change:+.1%} [{confidence:.0%} CI {self.ci_low:+.1%}, "
                f"{self.ci_high:+.1%}] ({self.rule}: {bound})")


@dataclass
class Decision:
    promote: bool
    reasons: list[str]
    """One line per check, failed checks first; each says what was measured against what."""
    failed_checks: list[str] = field(default_factory=list)
    """Kinds of the failed checks: "requests", "lossless", "gain", "wall_clock", "slice"."""
    slices: list[SliceVerdict] = field(default_factory=list)
    """The per-slice table, in report order (slices by name, then the pool)."""

    @property
    def blocking_slices(self) -> list[str]:
        """Slice names whose group failed (a failed pool names all its members)."""
        return sorted({m for v in self.slices if not v.ok for m in v.members})

    def as_dict(self) -> dict[str, Any]:
        return {"promote": self.promote, "reasons": self.reasons, "failed_checks": self.failed_checks,
                "blocking_slices": self.blocking_slices, "slices": [asdict(v) for v in self.slices]}


def _resample_indices(n: int, config: ShadowConfig) -> np.ndarray:
    """[bootstrap_resamples, n] request indices drawn with replacement, seeded by bootstrap_seed."""
    return np.random.default_rng(config.bootstrap_seed).integers(0, n, size=(config.bootstrap_resamples, n))


def _t_quantile(p: float, df: int) -> float:
    """Student-t quantile by the Cornish-Fisher expansion around the normal one (Abramowitz & Stegun
    26.7.5): within 1e-3 of the exact value from 5 degrees of freedom up."""
    z = NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def small_sample_widening(n: int, confidence: float) -> float:
    """How much wider than the percentile bootstrap an interval of a mean of n requests must be.

    The percentile bootstrap of a mean resamples with the plug-in variance ((n - 1) / n of the unbiased
    one) and behaves like a normal interval; for n = 24..40 requests Student-t tails are wider. Without
    this the gate's one-sided 2.5 % test promoted ~3.4 % of challengers no better than the champion
    (tests/evaluation/test_gate_calibration.py). The factor sqrt(n / (n - 1)) * t / z is 1.08 at n = 24."""
    if n < 3:
        return 1.0
    p = 1.0 - (1.0 - confidence) / 2
    return (n / (n - 1)) ** 0.5 * _t_quantile(p, n - 1) / NormalDist().inv_cdf(p)


def _percentiles(statistics: np.ndarray, config: ShadowConfig, estimate: float, n: int) -> tuple[float, float]:
    """The percentile interval of `statistics`, widened around `estimate` by `small_sample_widening(n)`."""
    alpha = 1.0 - config.confidence
    low, high = np.quantile(statistics, [alpha / 2, 1 - alpha / 2])
    widen = small_sample_widening(n, config.confidence)
    return float(estimate - widen * (estimate - low)), float(estimate + widen * (high - estimate))


def bootstrap_ci(values: np.ndarray, config: ShadowConfig) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (pass differences for a paired interval), widened
    for small samples (`small_sample_widening`)."""
    values = np.asarray(values, dtype=float)
    return _percentiles(values[_resample_indices(len(values), config)].mean(axis=1), config,
                        float(values.mean()), len(values))


def relative_change(champion: np.ndarray, challenger: np.ndarray) -> np.ndarray:
    """(sum challenger / sum champion) - 1 along the last axis; 0 where the champion's sum is 0."""
    base, new = np.sum(champion, axis=-1), np.sum(challenger, axis=-1)
    return np.where(base > 0, new / np.where(base > 0, base, 1.0) - 1.0, 0.0)


def relative_change_ci(champion: np.ndarray, challenger: np.ndarray, config: ShadowConfig) -> tuple[float, float]:
    """Paired percentile bootstrap CI of the relative change of the mean: each resample draws requests,
    both arms of a request together, and takes the ratio of the two resampled means."""
    champion, challenger = np.asarray(champion, dtype=float), np.asarray(challenger, dtype=float)
    idx = _resample_indices(len(champion), config)
    return _percentiles(relative_change(champion[idx], challenger[idx]), config,
                        float(relative_change(champion, challenger)), len(champion))


def _arm_summary(values: np.ndarray, config: ShadowConfig) -> dict[str, float]:
    low, high = bootstrap_ci(values, config)
    return {"mean": float(values.mean()), "ci_low": low, "ci_high": high}


def _compare(requests: list[dict[str, Any]], config: ShadowConfig) -> dict[str, Any]:
    """Champion, challenger, paired-difference and relative-change summaries of the gated metric for some
    requests, the other figures' means beside (`REPORTED`, and under `draft_alone` when replayed) and the
    wall clock's relative change with its interval."""
    metric = config.metric
    champ = np.array([r["champion"][metric] for r in requests], dtype=float)
    chall = np.array([r["challenger"][metric] for r in requests], dtype=float)
    result = {"n": len(requests), "metric": metric, "champion": _arm_summary(champ, config),
              "challenger": _arm_summary(chall, config), "difference": _arm_summary(chall - champ, config)}
    result["relative_change"] = float(relative_change(champ, chall))
    low, high = relative_change_ci(champ, chall, config)
    result["relative"] = {"mean": result["relative_change"], "ci_low": low, "ci_high": high}
    for arm in ("champion", "challenger"):
        result[arm].update(_means([r[arm] for r in requests]))
        if all("steps_by_source" in r[arm] for r in requests):
            result[arm]["steps_by_source"] = source_shares(add_counts(r[arm]["steps_by_source"] for r in requests))
        alone = [r[arm]["draft_alone"] for r in requests if "draft_alone" in r[arm]]
        if len(alone) == len(requests):
            result[arm]["draft_alone"] = _means(alone)
    wall = [np.array([r[arm]["tokens_per_s"] for r in requests], dtype=float) for arm in ("champion", "challenger")]
    low, high = relative_change_ci(*wall, config)
    result["wall_clock"] = {"mean": float(relative_change(*wall)), "ci_low": low, "ci_high": high}
    return result


def _means(figures: list[dict[str, Any]]) -> dict[str, float]:
    return {key: float(np.mean([f[key] for f in figures])) for key in REPORTED if all(key in f for f in figures)}


def slice_groups(counts: dict[str, int], min_slice_requests: int) -> dict[str, list[str]]:
    """Gating groups: {slice: [slice]} for every slice, plus {POOLED: small slices} when at least two
    slices have fewer than `min_slice_requests` requests (a pool of one would repeat that slice)."""
    groups = {name: [name] for name in sorted(counts)}
    small = [name for name in sorted(counts) if counts[name] < min_slice_requests]
    if len(small) >= 2:
        groups[POOLED] = small
    return groups


def summarize(requests: list[dict[str, Any]], config: ShadowConfig) -> dict[str, Any]:
    """{"overall": comparison, "slices": {slice: comparison}[, "pooled": comparison + members]}."""
    if not requests:
        raise ValueError("requests: nothing to summarize")
    by_slice: dict[str, list[dict[str, Any]]] = {}
    for r in requests:
        by_slice.setdefault(r["slice"], []).append(r)
    groups = slice_groups({name: len(rows) for name, rows in by_slice.items()}, config.min_slice_requests)
    summary = {"metric": config.metric, "overall": _compare(requests, config),
               "slices": {name: _compare(by_slice[name], config) for name in sorted(by_slice)}}
    if POOLED in groups:
        pooled = [r for name in groups[POOLED] for r in by_slice[name]]
        summary["pooled"] = {**_compare(pooled, config), "members": groups[POOLED]}
    return summary


def _verdict(group: str, members: list[str], figures: dict[str, Any], tolerance: float,
             config: ShadowConfig) -> SliceVerdict:
    n, rel = figures["n"], figures["relative"]
    if n >= config.min_slice_requests:
        rule, ok = NON_INFERIORITY, rel["ci_low"] > -tolerance
    elif n >= MIN_EVIDENCE:
        rule, ok = CLEAR_REGRESSION, rel["ci_high"] >= -tolerance
    else:
        rule, ok = TOO_FEW, True
    return SliceVerdict(group=group, members=members, n=n, rule=rule, tolerance=tolerance, metric=figures["metric"],
                        champion_mean=figures["champion"]["mean"], challenger_mean=figures["challenger"]["mean"],
                        relative_change=rel["mean"], ci_low=rel["ci_low"], ci_high=rel["ci_high"], ok=bool(ok))


def slice_verdicts(summary: dict[str, Any], config: ShadowConfig) -> list[SliceVerdict]:
    """The per-slice table: every slice by the rule its size calls for, then the pool of small slices."""
    verdicts = [_verdict(name, [name], figures, config.tolerance(name), config)
                for name, figures in summary["slices"].items()]
    if "pooled" in summary:
        pooled = summary["pooled"]
        verdicts.append(_verdict(POOLED, list(pooled["members"]), pooled, config.slice_tolerance, config))
    return verdicts


def gate(report: dict[str, Any], config: ShadowConfig) -> Decision:
    """Promote iff enough requests, lossless, gain CI lower bound > min_gain, and every slice group passes."""
    requests = report["requests"]
    failed: list[tuple[str, str]] = []
    passed: list[str] = []

    def check(kind: str, ok: bool, message: str) -> None:
        if ok:
            passed.append("ok: " + message)
        else:
            failed.append((kind, "FAIL: " + message))

    check("requests", len(requests) >= config.min_requests,
          f"{len(requests)} requests replayed (minimum {config.min_requests})")
    lossless = report["lossless"]
    bad = [m for m in lossless["mismatches"] if m["model"] == "challenger"]
    check("lossless", not bad and lossless["checked"] >= len(requests),
          f"lossless: challenger greedy output identical to target-only decoding on "
          f"{lossless['checked'] - len(bad)}/{len(requests)} prompts"
          + (f"; mismatched prompt ids: {', '.join(m['id'] for m in bad)}" if bad else ""))
    verdicts: list[SliceVerdict] = []
    if len(requests) >= 2:
        summary = summarize(requests, config)
        diff = summary["overall"]["difference"]
        check("gain", diff["ci_low"] > config.min_gain,
              f"{config.metric.replace('_', ' ')} gain {diff['mean']:+.4f}, {config.confidence:.0%} paired bootstrap "
              f"CI [{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}], lower bound must exceed {config.min_gain:+.4f}")
        wall = summary["overall"]["wall_clock"]
        check("wall_clock", wall["ci_high"] >= -config.wall_tolerance,
              f"wall clock tokens/s {wall['mean']:+.1%} [{wall['ci_low']:+.1%}, {wall['ci_high']:+.1%}]: vetoes only "
              f"if the upper bound is below -{config.wall_tolerance:.0%}")
        verdicts = slice_verdicts(summary, config)
        for verdict in verdicts:
            check("slice", verdict.ok, verdict.describe(config.confidence))
    return Decision(promote=not failed, reasons=[line for _, line in failed] + passed,
                    failed_checks=sorted({kind for kind, _ in failed}), slices=verdicts)


def source_lines(summary: dict[str, Any]) -> list[str]:
    """Per slice, where each draft's as-served steps went (`steps_by_source`: share of the steps x tokens
    each): a draft's own gain reaches serving only on its share of the steps."""
    lines = []
    for name, figures in summary["slices"].items():
        arms = [f"{arm} {describe_shares(figures[arm]['steps_by_source'])}" for arm in ("champion", "challenger")
                if figures[arm].get("steps_by_source")]
        if arms:
            lines.append(f"{name}: " + "; ".join(arms))
    return lines


def slice_table(decision: Decision) -> str:
    """The per-slice table as fixed-width text (for logs, the CLI and docs)."""
    names = [v.group if v.group != POOLED else f"{POOLED}({'+'.join(v.members)})" for v in decision.slices]
    width = max([len("group"), *map(len, names)])
    lines = [f"{'group':<{width}} {'n':>4} {'champion':>9} {'challenger':>10} {'change':>8} {'CI low':>8} "
             f"{'CI high':>8} {'tol':>5}  {'rule':<18} verdict"]
    for name, v in zip(names, decision.slices):
        lines.append(f"{name:<{width}} {v.n:>4} {v.champion_mean:>9.3f} {v.challenger_mean:>10.3f} "
                     f"{v.relative_change:>+8.1%} {v.ci_low:>+8.1%} {v.ci_high:>+8.1%} {-v.tolerance:>+5.0%}  "
                     f"{v.rule:<18} {'ok' if v.ok else 'VETO'}")
    return "\n".join(lines)


def plot_slices(summary: dict[str, Any], title: str = "") -> Any:
    """Grouped bars per slice (and overall): champion vs challenger in the gated metric, with CIs."""
    import matplotlib

    matplotlib.use("Agg")  # headless: shadow runs on servers and in tests
    import matplotlib.pyplot as plt

    groups = {**summary["slices"], "overall": summary["overall"]}
    names = list(groups)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(names) + 2), 4))
    for offset, arm in ((-0.2, "champion"), (0.2, "challenger")):
        means = np.array([groups[n][arm]["mean"] for n in names])
        errors = np.array([[means[i] - groups[n][arm]["ci_low"], groups[n][arm]["ci_high"] - means[i]]
                           for i, n in enumerate(names)]).T
        ax.bar(x + offset, means, width=0.4, yerr=errors, capsize=4, label=arm)
    ax.set_xticks(x, [f"{n}\n(n={groups[n]['n']})" for n in names])
    ax.set_ylabel({METRIC: "mean accepted length (tokens / verify step)",
                   SERVED_SPEEDUP: "as-served speed vs plain decoding (cost model)"}.get(summary.get("metric"), "metric"))
    ax.set_title(title or "shadow replay: champion vs challenger")
    ax.legend()
    fig.tight_layout()
    return fig
