"""`draftwheel demo` end to end on tiny models (~40 s, in the default suite): every step runs, the flywheel
promotes the better draft, and the after column shows it on held-out prompts."""

from __future__ import annotations

import json

from draftwheel import tracking
from flows.demo import demo
from flows.flywheel import override
from serving.models import weights_sha256
from tests.conftest import make_champion
from tests.flows.toy_world import build_models


def test_demo_runs_the_whole_story_on_tiny_models(tmp_path, monkeypatch, prefect_server, one_torch_thread):
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    dirs = build_models(tmp_path)
    # The stand-in "v0": a random draft registered the way bootstrap registers one.
    v0 = tracking.register_draft(dirs["bad"], {"target_sha256": weights_sha256(dirs["target"]), "stage": "bootstrap"})
    make_champion(v0)
    results = demo(None, [
        f"target={dirs['target']}", "trainer=tests.flows.toy_trainers:copy_model", "min_acceptance=0.9",
        override("train_overrides", [f"source={dirs['good']}"]), "chat_requests=6", "code_requests=10",
        "after_requests=2", "eval_requests=3", "max_new_tokens=12",
        override("shadow_overrides", ["max_new_tokens=12", "include_canary=false", "min_requests=2"]),
        override("mining_overrides", ["holdout_fraction=0.4"]),
    ])
    meta = results["meta"]
    assert meta["promoted"] and meta["champion_before"] == v0 and meta["champion_after"] != v0
    assert results["after"]["code"]["acceptance_rate"] == 1.0 > results["before"]["code"]["acceptance_rate"]
    saved = json.loads((tmp_path / "home" / "demo").glob("*/results.json").__next__().read_text())
    assert saved["after"] == results["after"]
    # The suffix tier's rows: both champions in mode hybrid over an index of the run's logs.
    assert set(results["before"]) == set(results["after"]) == {"chat", "code", "chat/hybrid", "code/hybrid"}
    hybrid = results["after"]["code/hybrid"]
    assert hybrid["requests"] == 3 and hybrid["speedup_vs_plain"] > 0 and hybrid["mean_accepted_length"] >= 1.0
