"""benchmarks/rounds.py's own logic, without models: the prompt plan (held-out prompts never served, the
new slice only from its round, no prompt twice), the gate summary of a shadow report, the table and the
plot. A real round needs the reference target and minutes; the flywheel it runs is tested in tests/flows."""

from __future__ import annotations

import json

import pytest


@pytest.fixture()
def rounds(load_benchmark):
    return load_benchmark("rounds")


def test_help(rounds, help_text):
    assert "--residual-floor" in help_text(rounds)


def test_the_plan_holds_out_its_eval_prompts_and_adds_the_new_slice_late(rounds):
    args = rounds.parse_args(["--home", "unused", "--rounds", "3", "--requests", "4", "--chat-requests", "2",
                              "--eval", "3", "--new-slice-at", "2"])
    rows = rounds.prompts(args, exclude=set())
    served = [row["prompt"] for r in (1, 2, 3) for row in rows[f"round/{r}"]]
    held_out = [row["prompt"] for name in rounds.SLICES for row in rows[f"eval/{name}"]]
    assert len(set(served)) == len(served) and not set(served) & set(held_out)
    assert all(len(rows[f"eval/{name}"]) == 3 for name in rounds.SLICES)
    assert {row["slice"] for row in rows["round/1"]} == {"chat", "code", "sql"}
    assert {row["slice"] for row in rows["round/2"]} == {"chat", "code", "sql", "tools"}
    assert sum(row["slice"] == "chat" for row in rows["round/3"]) == 2


def test_gate_summary_and_table(rounds, tmp_path):
    report = {"overall": {"relative": {"mean": 0.05, "ci_low": 0.01, "ci_high": 0.09},
                          "champion": {"draft_alone": {"mean_accepted_length": 1.2}},
                          "challenger": {"draft_alone": {"mean_accepted_length": 1.5}}}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    gate = rounds.gate_summary(str(tmp_path / "report.json"))
    assert gate["served_change"] == 0.05 and gate["served_ci"] == [0.01, 0.09]
    assert gate["alone_mal_change"] == pytest.approx(0.25)
    assert rounds.gate_summary(None) == {} and rounds.gate_summary(str(tmp_path / "none.json")) == {}
    figs = {"served_speedup": 2.0, "alone_speedup": 1.0, "suffix_speedup": 1.6, "served_over_best_part": 1.25,
            "served_mal": 3.0, "alone_mal": 1.2, "identical": "8/8 served, 8/8 alone, 8/8 suffix",
            "n": 8}
    row = {"round": 1, "champion": "2", "slices": {"code": figs, "chat": {**figs, "served_speedup": 1.0}},
           "outcome": "promoted", "gate": gate, "seconds": 300.0, "loop_seconds": 240.0}
    text = rounds.table([row])
    assert "(300 s, 240 s before the held-out measurement: promoted; its challenger in the gate: as served +5.0% [+1.0%, +9.0%], draft alone MAL +25.0%" in text
    assert rounds.pooled(row["slices"], "served_speedup") == 1.5
    assert "   2.00x   1.00x   1.60x       1.25x" in text  # served, alone, suffix, served over the better part
    assert "steps (share" not in text  # rows without step counts: no such line
    figs["served_steps"] = {"suffix": {"share": 0.78, "tokens_per_step": 3.61}, "plain": {"share": 0.22, "tokens_per_step": 1.0}}
    assert "code as served, steps (share x tokens each): suffix 78% x 3.61, plain 22% x 1.00" in rounds.table([row])


def test_plot_draws_both_panels(rounds, tmp_path):
    figs = {"served_speedup": 2.0, "alone_speedup": 1.0, "served_mal": 3.0, "alone_mal": 1.2, "identical": "", "n": 8}
    rounds_ = [{"round": r, "champion": "1", "slices": {name: figs for name in rounds.SLICES}} for r in (0, 1)]
    path = rounds.plot(rounds_, tmp_path / "rounds.png")
    assert path.stat().st_size > 1000


def test_a_rounds_traffic_is_one_mixed_stream(rounds):
    streams = [[{"slice": "chat", "prompt": f"c{i}"} for i in range(2)],
               [{"slice": "code", "prompt": f"k{i}"} for i in range(3)], []]
    assert [row["prompt"] for row in rounds.interleave(streams)] == ["c0", "k0", "c1", "k1", "k2"]
    assert rounds.interleave([]) == []


def test_figures_compare_as_served_with_the_better_of_its_parts(rounds):
    from types import SimpleNamespace

    def completion(tokens, seconds, steps, accepted, ids=(1, 2)):
        stats = SimpleNamespace(generated_tokens=tokens, latency_s=seconds, verify_steps=steps,
                                drafted_tokens=accepted + steps, accepted_tokens=accepted)
        step = SimpleNamespace(k=2, accepted=accepted // steps, source="suffix")
        return SimpleNamespace(stats=stats, token_ids=list(ids), record=SimpleNamespace(mode="hybrid", steps=[step] * steps))

    runs = {"plain": [completion(40, 4.0, 40, 0)], "served": [completion(40, 2.0, 16, 24)],
            "alone": [completion(40, 3.0, 30, 10)], "suffix": [completion(40, 2.5, 20, 20, ids=(9,))]}
    figs = rounds.figures(runs)
    assert figs["served_speedup"] == pytest.approx(2.0) and figs["suffix_speedup"] == pytest.approx(1.6)
    assert figs["served_over_best_part"] == pytest.approx(2.0 / 1.6)  # the index alone is the better part here
    assert figs["identical"] == "1/1 served, 1/1 alone, 0/1 suffix"
    assert figs["served_steps"] == {"suffix": {"share": 1.0, "tokens_per_step": 2.0}}  # 16 steps of 1 accepted + 1
