"""Shared helpers for the mining tests: small valid records, log writers, a toy tokenizer dir."""

from __future__ import annotations

import json
import numpy as np
from pathlib import Path

import pytest

from draftwheel.mining.config import MiningConfig
from draftwheel.mining.testing import synthetic_record


def make_record(index: int = 0, ts: float = 1.7e9, seed: int = 0, **overrides) -> dict:
    """A valid schema-v1 record (synthetic sizes) with fields overridden."""
    record = synthetic_record(np.random.default_rng(seed * 1_000_003 + index), index, ts)
    record.update(overrides)
    return record


def write_lines(path: Path, lines: list) -> Path:
    """Write dicts as JSON lines, bytes/str verbatim (a str/bytes item must carry its own newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        for line in lines:
            if isinstance(line, dict):
                handle.write(json.dumps(line).encode() + b"\n")
            else:
                handle.write(line.encode() if isinstance(line, str) else line)
    return path


def fast_config(**overrides) -> MiningConfig:
    """Small caps and no plot, so end-to-end tests take a second or two."""
    values = dict(max_hard_per_slice=20, max_rollback_per_slice=5, holdout_max=20, plot=False)
    values.update(overrides)
    return MiningConfig(**values)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The toy byte-level BPE tokenizer (vocab 384, chat template) saved as a local dir."""
    from draftwheel.serving.testing import build_tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer().save_pretrained(path)
    return path
