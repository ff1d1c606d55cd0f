"""Fixtures for the benchmarks' smoke tests.

The benchmarks are scripts, not a package: each is run as `python benchmarks/NAME.py`, which puts
benchmarks/ on sys.path so they import their shared helpers (`bench_io`, `bench_serving.PROMPTS`).
`load_benchmark(name)` does the same and imports the script as a module. Each test runs a benchmark's
argument parsing and its core on toy models in seconds: what it checks is that the command runs and
writes what it promises, not what it measures.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture()
def load_benchmark(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture()
def home(tmp_path, monkeypatch):
    """A fresh state dir: the benchmarks write their JSON under it by default."""
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


@pytest.fixture()
def help_text(capsys):
    """`help_text(module)`: its `--help` exits 0; returns what it printed."""
    def show(module) -> str:
        with pytest.raises(SystemExit) as exit_:
            module.parse_args(["--help"])
        assert exit_.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith("usage:")
        return text
    return show
