"""The shadow gate: statistics and the promote/reject decision over a shadow report.

`summarize(requests, config)` turns per-request figures (champion and challenger on the same prompts)
into overall and per-slice means with bootstrap intervals; `gate(report, config)` decides. The
decision rests on a paired bootstrap of the per-request difference in mean accepted length (tokens
per target verification step): pairing removes the prompt-to-prompt variance both drafts share, so a
small real gain is not drowned by how hard the prompts are. `plot_slices` draws champion vs
challenger per slice. This module runs no models and does no I/O except saving the figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

METRIC = "mean_accepted_length"


@dataclass
class ShadowConfig:
    """Settings of `draftwheel shadow` (configs/shadow.yaml)."""

    min_gain: float = 0.0
    """Promote only if the lower CI bound of the mean per-request gain in accepted length exceeds this."""
    confidence: float = 0.95
    """Two-sided confidence level of the bootstrap intervals."""
    bootstrap_resamples: int = 2000
    """Bootstrap resamples (numpy, seeded by bootstrap_seed, so a report is reproducible)."""
    bootstrap_seed: int = 0
    """Seed of the bootstrap resampling."""
    slice_tolerance: float = 0.05
    """Largest allowed relative drop of a slice's mean accepted length (0.05 = 5 %)."""
    slice_tolerances: dict[str, float] = field(default_factory=dict)
    """Per-slice overrides of slice_tolerance, e.g. {code: 0.02}."""
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
    """Draft tokens per verification step."""

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence: must be in (0, 1), got {self.confidence!r}")
        if self.bootstrap_resamples < 100:
            raise ValueError(f"bootstrap_resamples: must be >= 100, got {self.bootstrap_resamples!r}")
        for name, value in {"slice_tolerance": self.slice_tolerance, **{
                f"slice_tolerances.{k}": v for k, v in self.slice_tolerances.items()}}.items():
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name}: must be a fraction in [0, 1), got {value!r}")
        for name in ("min_requests", "max_requests", "max_new_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if self.min_requests < 2:
            raise ValueError(f"min_requests: a bootstrap needs at least 2 requests, got {self.min_requests!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature: must be in [0, 100], got {self.temperature!r}")
        if not 1 <= self.k <= 32:
            raise ValueError(f"k: must be in 1..32, got {self.k!r}")

    def tolerance(self, slice_name: str) -> float:
        return float(self.slice_tolerances.get(slice_name, self.slice_tolerance))


@dataclass
class Decision:
    promote: bool
    reasons: list[str]
    """One line per check, failed checks first; each says what was measured against what."""


def bootstrap_ci(values: np.ndarray, config: ShadowConfig) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (pass differences for a paired interval)."""
    values = np.asarray(values, dtype=float)
    rng = np.random.default_rng(config.bootstrap_seed)
    idx = rng.integers(0, len(values), size=(config.bootstrap_resamples, len(values)))
    means = values[idx].mean(axis=1)
    alpha = 1.0 - config.confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def _arm_summary(values: np.ndarray, config: ShadowConfig) -> dict[str, float]:
    low, high = bootstrap_ci(values, config)
    return {"mean": float(values.mean()), "ci_low": low, "ci_high": high}


def _compare(requests: list[dict[str, Any]], config: ShadowConfig) -> dict[str, Any]:
    """Champion, challenger and paired-difference summaries of the gated metric for some requests."""
    champ = np.array([r["champion"][METRIC] for r in requests], dtype=float)
    chall = np.array([r["challenger"][METRIC] for r in requests], dtype=float)
    result = {"n": len(requests), "champion": _arm_summary(champ, config),
              "challenger": _arm_summary(chall, config), "difference": _arm_summary(chall - champ, config)}
    base = result["champion"]["mean"]
    result["relative_change"] = (result["challenger"]["mean"] - base) / base if base else 0.0
    for arm in ("champion", "challenger"):
        for key in ("acceptance_rate", "tokens_per_s"):
            result[arm][key] = float(np.mean([r[arm][key] for r in requests]))
    if all("target_only" in r for r in requests):  # replays carry it; constructed reports may not
        result["target_only_tokens_per_s"] = float(np.mean([r["target_only"]["tokens_per_s"] for r in requests]))
    return result


def summarize(requests: list[dict[str, Any]], config: ShadowConfig) -> dict[str, Any]:
    """{"overall": comparison, "slices": {slice: comparison}} of mean accepted length."""
    if not requests:
        raise ValueError("requests: nothing to summarize")
    slices = sorted({r["slice"] for r in requests})
    return {"metric": METRIC, "overall": _compare(requests, config),
            "slices": {s: _compare([r for r in requests if r["slice"] == s], config) for s in slices}}


def gate(report: dict[str, Any], config: ShadowConfig) -> Decision:
    """Promote iff enough requests, lossless, CI lower bound > min_gain, and no slice regresses too much."""
    requests = report["requests"]
    failed: list[str] = []
    passed: list[str] = []

    def check(ok: bool, message: str) -> None:
        (passed if ok else failed).append(("ok: " if ok else "FAIL: ") + message)

    check(len(requests) >= config.min_requests,
          f"{len(requests)} requests replayed (minimum {config.min_requests})")
    lossless = report["lossless"]
    bad = [m for m in lossless["mismatches"] if m["model"] == "challenger"]
    check(not bad and lossless["checked"] >= len(requests),
          f"lossless: challenger greedy output identical to target-only decoding on "
          f"{lossless['checked'] - len(bad)}/{len(requests)} prompts"
          + (f"; mismatched prompt ids: {', '.join(m['id'] for m in bad)}" if bad else ""))
    if len(requests) >= 2:
        summary = summarize(requests, config)
        diff = summary["overall"]["difference"]
        check(diff["ci_low"] > config.min_gain,
              f"mean accepted length gain {diff['mean']:+.4f}, {config.confidence:.0%} paired bootstrap CI "
              f"[{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}], lower bound must exceed {config.min_gain:+.4f}")
        for name, figures in summary["slices"].items():
            tol = config.tolerance(name)
            check(figures["relative_change"] >= -tol,
                  f"slice {name!r}: mean accepted length {figures['champion']['mean']:.4f} -> "
                  f"{figures['challenger']['mean']:.4f} ({figures['relative_change']:+.1%}, tolerance -{tol:.0%})")
    return Decision(promote=not failed, reasons=failed + passed)


def plot_slices(summary: dict[str, Any], title: str = "") -> Any:
    """Grouped bars per slice (and overall): champion vs challenger mean accepted length with CIs."""
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
    ax.set_ylabel("mean accepted length (tokens / verify step)")
    ax.set_title(title or "shadow replay: champion vs challenger")
    ax.legend()
    fig.tight_layout()
    return fig
