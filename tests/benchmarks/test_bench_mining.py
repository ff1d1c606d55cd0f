"""benchmarks/bench_mining.py at a few hundred records: the synthetic logs carry one broken line per
1000 records, which mining quarantines, and every other record is kept; the command runs each size in
a child process (its own peak RSS) and leaves no logs behind unless asked."""

from __future__ import annotations

import json


def test_help(load_benchmark, help_text):
    assert "--sizes" in help_text(load_benchmark("bench_mining"))


def test_one_mining_pass_counts_and_quarantines(load_benchmark, tmp_path, capsys):
    bench = load_benchmark("bench_mining")
    from draftwheel.serving.testing import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path / "tokenizer")
    bench.generate(tmp_path / "logs", 1000)
    bench.child(tmp_path / "logs", tmp_path / "out", tmp_path / "tokenizer")
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["records"] == 1000 and figures["lines"] == 1001 and figures["quarantined"] == 1
    assert figures["redactions"]["EMAIL"] > 0  # one prompt in 100 carries an e-mail address
    assert figures["records_per_s"] > 0 and figures["peak_rss_total_mib"] > 0


def test_the_command_mines_in_a_child_process(load_benchmark, home):
    bench = load_benchmark("bench_mining")
    summary = bench.main(["--sizes", "200", "--no-tracking"])
    run, = summary["runs"]
    assert run["size"] == 200 and run["records"] == 200
    assert json.loads((home / "benchmarks" / "bench_mining.json").read_text())["runs"][0]["records"] == 200
    assert [p.name for p in home.iterdir()] == ["benchmarks"]  # the work dir is gone
