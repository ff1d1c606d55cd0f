"""benchmarks/bench_io.py: a result's JSON lands under the state dir unless --out says otherwise, and its
numeric figures become MLflow metric names MLflow accepts."""

from __future__ import annotations

import argparse
import json

import pytest


@pytest.fixture()
def bench_io(load_benchmark):
    return load_benchmark("bench_io")


def _args(bench_io, argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=4)
    bench_io.add_output_arguments(parser, "demo_bench")
    return parser.parse_args(argv)


def test_numeric_figures_flatten_nested_results_and_skip_what_is_not_a_number(bench_io):
    result = {"a": 1, "b": {"c": 2.5, "d": "8/8", "e": True, "f": float("nan")}, "runs": [{"x": 3}],
              "µs per step": 4, "repetitive_t0.7": {"hybrid_vs_draft": 1.3}}
    assert bench_io.numeric_figures(result) == {"a": 1.0, "b.c": 2.5, "runs.0.x": 3.0, "_s per step": 4.0,
                                                "repetitive_t0.7.hybrid_vs_draft": 1.3}


def test_save_writes_under_the_state_dir_by_default_or_to_out(bench_io, home, tmp_path):
    out = bench_io.save("demo_bench", {"speedup": 1.5}, _args(bench_io, ["--no-tracking"]))
    assert out == home / "benchmarks" / "demo_bench.json" and json.loads(out.read_text()) == {"speedup": 1.5}
    given = tmp_path / "elsewhere" / "r.json"
    assert bench_io.save("demo_bench", {"x": 1}, _args(bench_io, ["--no-tracking", "--out", str(given)])) == given
    assert given.is_file()


def test_save_logs_a_run_with_the_figures_and_the_json(bench_io, home):
    from draftwheel.tracking import setup_mlflow

    bench_io.save("demo_bench", {"speedup": 1.5, "slices": {"code": {"mal": 2.0}}}, _args(bench_io, ["--k", "3"]))
    import mlflow

    setup_mlflow()
    run, = mlflow.search_runs(experiment_names=["draftwheel"], output_format="list")
    assert run.data.tags["benchmark"] == "demo_bench" and run.data.params == {"k": "3"}
    assert run.data.metrics == {"speedup": 1.5, "slices.code.mal": 2.0}
    artifacts = mlflow.MlflowClient().list_artifacts(run.info.run_id)
    assert [a.path for a in artifacts] == ["demo_bench.json"]
