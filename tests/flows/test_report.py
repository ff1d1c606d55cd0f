"""The demo's before/after figures and their rendering; the demo's config file."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftwheel.config import load_config
from draftwheel.flows import report
from draftwheel.flows.demo import DemoConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def stats(generated, latency, drafted=0, accepted=0, steps=0):
    return SimpleNamespace(generated_tokens=generated, latency_s=latency, drafted_tokens=drafted,
                           accepted_tokens=accepted, verify_steps=steps)


def test_figures_are_token_weighted_and_relative_to_plain():
    # Two requests: 30 tokens in 1 s and 10 tokens in 1 s; 40 drafted, 30 accepted over 10 steps.
    spec = [stats(30, 1.0, drafted=24, accepted=22, steps=6), stats(10, 1.0, drafted=16, accepted=8, steps=4)]
    plain = [stats(40, 4.0)]
    figs = report.figures(spec, plain)
    assert figs["acceptance_rate"] == pytest.approx(30 / 40)
    assert figs["mean_accepted_length"] == pytest.approx((30 + 10) / 10)
    assert figs["tokens_per_s"] == pytest.approx(20.0) and figs["plain_tokens_per_s"] == pytest.approx(10.0)
    assert figs["speedup_vs_plain"] == pytest.approx(2.0) and figs["requests"] == 2


def test_figures_need_both_runs():
    with pytest.raises(ValueError, match="at least one"):
        report.figures([], [stats(1, 1.0)])


def results():
    def figs(rate, length, tps):
        return {"requests": 8, "acceptance_rate": rate, "mean_accepted_length": length, "tokens_per_s": tps,
                "plain_tokens_per_s": 20.0, "speedup_vs_plain": tps / 20.0}
    return {"before": {"chat": figs(0.8, 3.5, 40.0), "code": figs(0.4, 2.0, 24.0)},
            "after": {"chat": figs(0.78, 3.4, 39.0), "code": figs(0.6, 2.8, 32.0)},
            "meta": {"champion_before": "1", "champion_after": "2"}}


def test_rows_and_markdown_show_each_slice_and_the_change():
    table = report.rows(results())
    assert len(table) == 2 * len(report.METRICS)
    code_length = next(r for r in table if r[0] == "code" and r[1] == "mean accepted length")
    assert code_length[2:] == ["2.00", "2.80", "+40.0%"]
    markdown = report.to_markdown(results())
    assert "| code | speedup vs plain | 1.20x | 1.60x | +33.3% |" in markdown
    assert "champion_after: 2" in markdown


def test_save_writes_json_markdown_and_plot(tmp_path, capsys):
    paths = report.save(results(), tmp_path / "out")
    assert json.loads(paths["json"].read_text())["after"]["code"]["acceptance_rate"] == 0.6
    assert paths["markdown"].read_text().startswith("# draftwheel demo")
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"
    report.print_table(results())
    assert "+40.0%" in capsys.readouterr().out


def test_demo_config_file_mirrors_the_defaults_and_rejects_bad_values():
    assert load_config(DemoConfig, CONFIGS / "demo.yaml") == DemoConfig()
    with pytest.raises(ValueError, match="trigger_ratio"):
        load_config(DemoConfig, None, ["trigger_ratio=1.5"])
    with pytest.raises(ValueError, match="eval_requests"):
        load_config(DemoConfig, None, ["eval_requests=0"])


def test_the_headline_puts_the_round_as_served_first_and_the_draft_alone_beside():
    data = results()
    for phase, served in (("before", 2.0), ("after", 2.2)):  # the code slice as serving runs it (hybrid)
        data[phase]["code/hybrid"] = {**data[phase]["code"], "speedup_vs_plain": served}
    lines = report.headline(data)
    assert lines == ["chat: draft alone 2.00x -> 1.95x plain (-2.5%)",
                     "code: as served 2.00x -> 2.20x plain (+10.0%); draft alone 1.20x -> 1.60x plain (+33.3%)"]
    assert [row[0] for row in report.rows(data)][::len(report.METRICS)] == ["chat", "code/hybrid", "code"]
    assert "- code: as served 2.00x -> 2.20x plain (+10.0%)" in report.to_markdown(data)


def test_a_round_that_kept_its_champion_reports_each_figure_once_not_a_change():
    data = results()
    data["after"] = data["before"]
    data["meta"] = {"champion_before": "1", "champion_after": "1"}
    for phase in report.PHASES:
        data[phase]["code/hybrid"] = {**data["before"]["code"], "speedup_vs_plain": 2.0, "greedy_identical": "8/8"}
    assert report.headline(data) == ["chat: draft alone 2.00x plain (champion unchanged)",
                                     "code: as served 2.00x plain (champion unchanged, greedy identical 8/8); "
                                     "draft alone 1.20x plain (champion unchanged)"]


def test_the_as_served_steps_show_where_a_slices_figure_came_from_before_and_after():
    data = results()
    shares = {"before": {"suffix": {"share": 0.79, "tokens_per_step": 3.64}, "plain": {"share": 0.21, "tokens_per_step": 1.0}},
              "after": {"suffix": {"share": 0.72, "tokens_per_step": 3.86},
                        "eagle3": {"share": 0.15, "tokens_per_step": 1.13}, "plain": {"share": 0.13, "tokens_per_step": 1.0}}}
    for phase in report.PHASES:
        data[phase]["code/hybrid"] = {**data[phase]["code"], "steps_by_source": shares[phase]}
    assert report.served_steps(data) == ["code: before suffix 79% x 3.64, plain 21% x 1.00; "
                                         "after suffix 72% x 3.86, eagle3 15% x 1.13, plain 13% x 1.00"]
    assert "- as served, steps by source (share x tokens each) on code: before suffix 79%" in report.to_markdown(data)
    data["after"], data["meta"] = data["before"], {"champion_before": "1", "champion_after": "1"}
    assert report.served_steps(data) == ["code: before suffix 79% x 3.64, plain 21% x 1.00"]  # kept: once
    del data["before"]["code/hybrid"]["steps_by_source"]
    assert report.served_steps(data) == []
