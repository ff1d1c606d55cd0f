"""The LinUCB router: it learns which arm pays in which context, explores untried arms, respects what
the engine can serve, and its state round-trips and resets with the champion."""

from __future__ import annotations

import numpy as np
import pytest

from draftwheel.serving.engine.router import ARMS, Router, RouterConfig, features, load_state


def test_features_are_scaled_and_slices_hash_stably():
    config = RouterConfig(slice_buckets=4)
    x = features(config, "sql", prompt_tokens=100, match_len=64, recent_acceptance=1.7)
    assert x.shape == (8,) and x[0] == 1.0 and x[1:5].sum() == 1.0
    assert x[-2] == 1.0 and x[-1] == 1.0 and 0 < x[-3] < 1  # match capped at 32, acceptance clipped
    assert np.array_equal(x, features(config, "sql", 100, 64, 1.7))


def test_untried_arms_are_explored_before_exploiting():
    router = Router(RouterConfig(alpha=0.0))
    x = features(router.config, "chat", 50, 0, 0.5)
    chosen = []
    for _ in range(len(ARMS)):
        arm = router.choose(x)
        chosen.append(arm)
        router.update(arm, x, tokens_per_s=50.0 if arm == "none" else 1.0)
    assert sorted(chosen) == sorted(ARMS)  # each arm once, though the first one paid best
    assert router.choose(x) == "none"


def test_learns_the_best_arm_per_context():
    """Simulated rewards: the suffix arm is fast on repetitive requests (long matches), the draft on
    chat. After a few hundred requests the router picks each where it pays."""
    router = Router()
    rng = np.random.default_rng(0)
    speed = {"sql": {"none": 20, "draft_k2": 24, "draft_k4": 25, "suffix": 45, "hybrid": 40},
             "chat": {"none": 20, "draft_k2": 26, "draft_k4": 30, "suffix": 19, "hybrid": 25}}
    best = []
    for _ in range(400):
        kind = str(rng.choice(["sql", "chat"]))
        x = features(router.config, kind, 80, 24 if kind == "sql" else 2, 0.6)
        arm = router.choose(x)
        router.update(arm, x, speed[kind][arm] + rng.normal(0, 2))
        best.append(arm == max(speed[kind], key=speed[kind].get))
    assert np.mean(best[-100:]) > 0.9
    assert router.choose(features(router.config, "sql", 80, 24, 0.6), explore=False) == "suffix"
    assert router.choose(features(router.config, "chat", 80, 2, 0.6), explore=False) == "draft_k4"


def test_only_available_arms_are_chosen():
    router = Router()
    x = features(router.config, "chat", 10, 0, 0.0)
    assert router.choose(x, available=["none", "suffix"]) in ("none", "suffix")
    with pytest.raises(ValueError, match="available"):
        router.choose(x, available=["beam"])


def test_state_round_trips_and_resets_when_the_champion_changes(tmp_path):
    router = Router(RouterConfig(arms=["none", "suffix"]), champion="v3")
    x = features(router.config, "sql", 30, 8, 0.7)
    router.update("suffix", x, 40.0)
    path = tmp_path / "router.json"
    router.save(path)
    again = load_state(path, champion="v3")
    assert again.scores(x) == router.scores(x) and again.pulls == {"none": 0, "suffix": 1}
    fresh = load_state(path, champion="v4")
    assert fresh.pulls == dict.fromkeys(ARMS, 0) and fresh.champion == "v4"
    assert load_state(tmp_path / "missing.json", champion="v1").champion == "v1"


@pytest.mark.parametrize("bad, name", [({"alpha": -1.0}, "alpha"), ({"ridge": 0.0}, "ridge"),
                                       ({"reward_scale": 0.0}, "reward_scale"), ({"arms": ["beam"]}, "arms"),
                                       ({"slice_buckets": 0}, "slice_buckets")])
def test_config_rejects_bad_values_by_name(bad, name):
    with pytest.raises(ValueError, match=name):
        RouterConfig(**bad)
