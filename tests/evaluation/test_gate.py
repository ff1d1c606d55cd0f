"""The shadow gate on constructed reports: each decision path pinned down without any model.

Constructed slices: prompt difficulty (the champion's mean accepted length) is uniform on [1.5, 4], and
the challenger's figure on a prompt is the champion's times (1 + effect + noise), noise ~ N(0, sd).
So `effect` is the true relative change of the slice and `sd` the prompt-to-prompt scatter of that
change; a slice's bootstrap interval of the relative change has half-width about 2 sd / sqrt(n). The
assertions below follow from that: a -12 % slice of 30 prompts with sd 0.1 has an interval of about
+-4 % around -12 %, wholly below -5 % (veto); 4 prompts of pure noise give an interval of about +-10 %
around ~0, never wholly below -5 % (no veto); 4 prompts at -40 % are wholly below -5 % (veto).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from draftwheel.evaluation.gate import (CLEAR_REGRESSION, NON_INFERIORITY, POOLED, TOO_FEW, ShadowConfig, bootstrap_ci, gate,
                          relative_change_ci, slice_groups, slice_table, source_lines, summarize)

CONFIG = ShadowConfig(bootstrap_resamples=500)


def request(i: int, slice_name: str, champion: float, challenger: float) -> dict:
    arm = lambda mal: {"mean_accepted_length": mal, "served_speedup": mal, "acceptance_rate": (mal - 1) / 4,
                       "tokens_per_s": 10.0 * mal}
    return {"id": f"{slice_name}{i}", "slice": slice_name, "champion": arm(champion), "challenger": arm(challenger)}


def report(requests: list[dict], mismatches: list[dict] | None = None) -> dict:
    return {"requests": requests, "lossless": {"checked": len(requests), "mismatches": mismatches or []}}


def noisy_requests(gain: float, n: int = 40, seed: int = 1) -> list[dict]:
    """Prompt difficulty varies a lot (shared by both arms); the paired gain is `gain` plus small noise."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(1.5, 4.0, n)
    return [request(i, ("code", "prose")[i % 2], b, b + gain + rng.normal(0, 0.05)) for i, b in enumerate(base)]


def slice_rows(name: str, n: int, effect: float, sd: float, seed: int) -> list[dict]:
    """`n` prompts of one slice whose true relative change is `effect`, scattered by `sd` per prompt."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(1.5, 4.0, n)
    return [request(i, name, b, b * (1 + effect + rng.normal(0, sd))) for i, b in enumerate(base)]


NEW_SLICE = slice_rows("new", 30, 0.4, 0.1, seed=1)  # the slice the round trained for: +40 %
# The case: 4 canary prose prompts whose point estimate is -5.8 %, one prompt carrying it.
PROSE_NOISE = [request(i, "prose", c, c * (1 + e)) for i, (c, e) in
               enumerate(zip([2.0, 2.5, 3.0, 2.2], [0.04, -0.19, -0.05, -0.01]))]


def verdict(decision, group):
    return next(v for v in decision.slices if v.group == group)


def test_true_regression_on_a_large_slice_is_rejected():
    decision = gate(report(NEW_SLICE + slice_rows("prose", 30, -0.12, 0.1, seed=2)), ShadowConfig())
    assert not decision.promote and decision.failed_checks == ["slice"] and decision.blocking_slices == ["prose"]
    prose = verdict(decision, "prose")
    assert prose.rule == NON_INFERIORITY and prose.ci_high < -0.05 and not prose.ok
    assert decision.reasons[0].startswith("FAIL: slice 'prose' n=30:")


def test_noise_on_four_prompts_is_not_a_veto():
    decision = gate(report(NEW_SLICE + PROSE_NOISE), ShadowConfig())
    prose = verdict(decision, "prose")
    # The point estimate is beyond the tolerance (the old gate vetoed on it) ...
    assert prose.relative_change == pytest.approx(-0.058, abs=0.001)
    # ... but 4 prompts cannot show a regression beyond 5 %: the interval reaches well above -5 %.
    assert prose.rule == CLEAR_REGRESSION and prose.ci_low < -0.05 < prose.ci_high and prose.ok
    assert decision.promote, decision.reasons


def test_small_slice_with_a_large_real_regression_is_caught():
    decision = gate(report(NEW_SLICE + slice_rows("prose", 4, -0.4, 0.1, seed=3)), ShadowConfig())
    prose = verdict(decision, "prose")
    assert prose.rule == CLEAR_REGRESSION and prose.ci_high < -0.05 and not prose.ok
    assert not decision.promote and decision.blocking_slices == ["prose"]


def test_small_slices_are_pooled_and_the_pool_is_gated():
    # Two 6-prompt slices at -10 %: neither alone shows a loss beyond 5 % for sure, together (12 >= 10
    # prompts) they fail non-inferiority: the pool catches what no small slice could alone.
    rows = NEW_SLICE + slice_rows("prose", 6, -0.1, 0.08, seed=4) + slice_rows("chat", 6, -0.1, 0.08, seed=5)
    decision = gate(report(rows), ShadowConfig())
    assert verdict(decision, "prose").ok and verdict(decision, "chat").ok
    pool = verdict(decision, POOLED)
    assert pool.members == ["chat", "prose"] and pool.n == 12 and pool.rule == NON_INFERIORITY and not pool.ok
    assert not decision.promote and decision.blocking_slices == ["chat", "prose"]
    assert any(r.startswith("FAIL: other/pooled (chat, prose) n=12") for r in decision.reasons)


def test_non_inferiority_needs_evidence_not_just_a_small_point_loss():
    # -2 % is within the tolerance, but 12 scattered prompts cannot show that the loss is under 5 % ...
    noisy = gate(report(NEW_SLICE + slice_rows("prose", 12, -0.02, 0.1, seed=6)), ShadowConfig())
    assert not noisy.promote and verdict(noisy, "prose").ci_low < -0.05
    # ... 60 consistent prompts can.
    precise = gate(report(NEW_SLICE + slice_rows("prose", 60, -0.02, 0.02, seed=6)), ShadowConfig())
    assert precise.promote and -0.05 < verdict(precise, "prose").ci_low < verdict(precise, "prose").ci_high < 0


def test_two_requests_never_veto_alone():
    rows = NEW_SLICE + [request(0, "rare", 3.0, 1.5), request(1, "rare", 3.0, 1.6)]
    decision = gate(report(rows), ShadowConfig())
    assert verdict(decision, "rare").rule == TOO_FEW and decision.promote


def test_per_slice_tolerance_override():
    rows = NEW_SLICE + slice_rows("prose", 30, -0.12, 0.1, seed=2)
    decision = gate(report(rows), ShadowConfig(slice_tolerances={"prose": 0.25}))
    assert decision.promote and verdict(decision, "prose").tolerance == 0.25


def test_slice_groups():
    assert slice_groups({"a": 20, "b": 3, "c": 5}, 10) == {"a": ["a"], "b": ["b"], "c": ["c"], POOLED: ["b", "c"]}
    assert slice_groups({"a": 20, "b": 3}, 10) == {"a": ["a"], "b": ["b"]}  # a pool of one would repeat b


def test_relative_change_ci_is_paired_and_seeded():
    # Difficulty spreads the champion over 1.5..4, the challenger is 10 % better on every prompt with
    # 1 % scatter: paired, the ratio of means is pinned to +10 % within ~2 x 0.01 / sqrt(40) = 0.3 %;
    # resampling the arms independently would leave the ~+-9 % sampling error of a mean over 1.5..4.
    rows = slice_rows("a", 40, 0.1, 0.01, seed=0)
    champion = np.array([r["champion"]["mean_accepted_length"] for r in rows])
    challenger = np.array([r["challenger"]["mean_accepted_length"] for r in rows])
    low, high = relative_change_ci(champion, challenger, CONFIG)
    assert (low, high) == relative_change_ci(champion, challenger, CONFIG)
    assert 0.09 < low < high < 0.11 and high - low < 0.01


def test_table_lists_every_group():
    table = slice_table(gate(report(NEW_SLICE + PROSE_NOISE), ShadowConfig()))
    assert table.splitlines()[0].split()[:2] == ["group", "n"] and len(table.splitlines()) == 3
    assert "clear regression" in table and "non-inferiority" in table


def test_gate_clear_win_promotes():
    decision = gate(report(noisy_requests(0.3)), CONFIG)
    assert decision.promote, decision.reasons
    assert all(r.startswith("ok: ") for r in decision.reasons)


def test_gate_tie_rejects():
    # Identical drafts: the interval is [0, 0] and 0 does not exceed min_gain 0.
    decision = gate(report([request(i, "code", 2.0 + i % 3, 2.0 + i % 3) for i in range(20)]),
                    ShadowConfig(bootstrap_resamples=500, metric="mean_accepted_length"))
    assert not decision.promote and decision.failed_checks == ["gain"]
    assert decision.reasons[0].startswith("FAIL: mean accepted length gain +0.0000")


def test_gate_noise_only_rejects_but_small_paired_gain_passes():
    # Unpaired, a 0.1 gain is buried under a ~0.7 spread of prompt difficulty; paired, it is clear.
    assert gate(report(noisy_requests(0.1)), CONFIG).promote
    assert not gate(report(noisy_requests(0.0)), CONFIG).promote


def test_gate_min_gain_is_respected():
    assert not gate(report(noisy_requests(0.3)), ShadowConfig(bootstrap_resamples=500, min_gain=0.5)).promote


def test_gate_lossless_failure_rejects_and_names_prompt():
    rows = noisy_requests(0.5)
    mismatch = [{"id": "code7", "model": "challenger", "first_difference": 3}]
    decision = gate(report(rows, mismatch), CONFIG)
    assert not decision.promote and decision.failed_checks == ["lossless"]
    assert "mismatched prompt ids: code7" in decision.reasons[0]


def test_gate_too_few_requests_rejects():
    decision = gate(report(noisy_requests(1.0, n=4)), CONFIG)
    assert not decision.promote and decision.failed_checks == ["requests"]


def test_decision_as_dict_carries_what_a_retry_needs():
    decision = gate(report(NEW_SLICE + slice_rows("prose", 30, -0.12, 0.1, seed=2)), ShadowConfig())
    data = decision.as_dict()
    assert data["failed_checks"] == ["slice"] and data["blocking_slices"] == ["prose"]
    assert [row["group"] for row in data["slices"]] == ["new", "prose"] and data["slices"][1]["ok"] is False


def test_bootstrap_ci_is_seeded_and_covers_the_mean():
    values = np.random.default_rng(0).normal(1.0, 1.0, 200)
    low, high = bootstrap_ci(values, CONFIG)
    assert (low, high) == bootstrap_ci(values, CONFIG)
    # Standard error 1/sqrt(200) ~ 0.07: a 95 % interval is about +-0.14 around the sample mean.
    assert low < values.mean() < high and 0.2 < high - low < 0.4


def test_summarize_per_slice():
    summary = summarize([request(0, "a", 2, 3), request(1, "a", 2, 3), request(2, "b", 4, 2)], CONFIG)
    assert summary["slices"]["a"]["difference"]["mean"] == pytest.approx(1.0)
    assert summary["slices"]["b"]["relative_change"] == pytest.approx(-0.5)
    assert summary["slices"]["a"]["relative"] == {"mean": pytest.approx(0.5), "ci_low": pytest.approx(0.5),
                                                  "ci_high": pytest.approx(0.5)}
    assert summary["overall"]["n"] == 3
    assert summary["pooled"]["members"] == ["a", "b"] and summary["pooled"]["n"] == 3


def test_the_default_metric_is_the_served_speed_not_the_accepted_length():
    """A challenger that accepts longer chains but costs more per token as served (a slower draft, say)
    is rejected on the default metric, and would have passed on mean accepted length alone."""
    rng = np.random.default_rng(3)
    rows = []
    for i, base in enumerate(rng.uniform(1.5, 3.0, 24)):
        row = request(i, "code", base, base + 0.3)
        row["champion"]["served_speedup"], row["challenger"]["served_speedup"] = base, base * 0.9
        rows.append(row)
    assert not gate(report(rows), CONFIG).promote
    assert gate(report(rows), ShadowConfig(bootstrap_resamples=500, metric="mean_accepted_length")).promote


def test_the_wall_clock_vetoes_only_a_decisive_loss():
    rows = noisy_requests(0.5)
    slower = copy.deepcopy(rows)
    for row in slower:  # a real gain in the figures, but every request ran at 60 % of the champion's tokens/s
        row["challenger"]["tokens_per_s"] = 0.6 * row["champion"]["tokens_per_s"]
    decision = gate(report(slower), CONFIG)
    assert not decision.promote and decision.failed_checks == ["wall_clock"]
    noisy = copy.deepcopy(rows)
    rng = np.random.default_rng(4)
    for row in noisy:  # timing noise around no change: no veto
        row["challenger"]["tokens_per_s"] = row["champion"]["tokens_per_s"] * (1 + rng.normal(0, 0.15))
    assert gate(report(noisy), CONFIG).promote


def test_the_metric_is_checked():
    with pytest.raises(ValueError, match="metric"):
        ShadowConfig(metric="tokens_per_s")


def test_each_arms_steps_by_source_are_summed_over_its_requests_and_described_per_slice():
    """The replay's per-request step counts add up per slice into shares (of the steps) and tokens a step:
    where each draft's as-served figure came from."""
    rows = [request(i, "code", 3.0, 3.1) for i in range(3)]
    for i, row in enumerate(rows):
        row["champion"]["steps_by_source"] = {"suffix": [3, 12], "plain": [1, 1]}
        row["challenger"]["steps_by_source"] = {"suffix": [2, 8], "eagle3": [1, 2], "plain": [1, 1]}
    summary = summarize(rows, CONFIG)
    code = summary["slices"]["code"]
    assert code["champion"]["steps_by_source"] == {"suffix": {"share": 0.75, "tokens_per_step": 4.0},
                                                   "plain": {"share": 0.25, "tokens_per_step": 1.0}}
    assert code["challenger"]["steps_by_source"]["eagle3"] == {"share": 0.25, "tokens_per_step": 2.0}
    assert source_lines(summary) == ["code: champion suffix 75% x 4.00, plain 25% x 1.00; "
                                     "challenger suffix 50% x 4.00, eagle3 25% x 2.00, plain 25% x 1.00"]
    del rows[0]["champion"]["steps_by_source"]  # a report without the counts (an older replay): no shares
    assert "steps_by_source" not in summarize(rows, CONFIG)["slices"]["code"]["champion"]
