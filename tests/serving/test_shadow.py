"""Shadow replay and the promotion gate.

Gate tests use constructed reports so each decision path is pinned down exactly. Replay tests use toy
models: the "good" draft computes exactly the target's function (the target is the draft with extra
zeroed layers, so every draft token is accepted: mean accepted length k + 1), the "bad" draft is an
independent random model (few tokens accepted). A correct replay must therefore promote good over bad,
reject bad over good, and find every greedy output identical to target-only decoding.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset

from draftwheel.config import ConfigError, load_config
from draftwheel.tracking import NullTracker
from serving import toy
from serving.gate import ShadowConfig, bootstrap_ci, gate, summarize
from serving.models import load_model
from serving.shadow import DEFAULT_CANARY, load_canary, run_shadow

CONFIG = ShadowConfig(bootstrap_resamples=500)


def request(i: int, slice_name: str, champion: float, challenger: float) -> dict:
    arm = lambda mal: {"mean_accepted_length": mal, "acceptance_rate": (mal - 1) / 4, "tokens_per_s": 10.0 * mal}
    return {"id": f"r{i}", "slice": slice_name, "champion": arm(champion), "challenger": arm(challenger)}


def report(requests: list[dict], mismatches: list[dict] | None = None) -> dict:
    return {"requests": requests, "lossless": {"checked": len(requests), "mismatches": mismatches or []}}


def noisy_requests(gain: float, n: int = 40, seed: int = 1) -> list[dict]:
    """Prompt difficulty varies a lot (shared by both arms); the paired gain is `gain` plus small noise."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(1.5, 4.0, n)
    return [request(i, ("code", "prose")[i % 2], b, b + gain + rng.normal(0, 0.05)) for i, b in enumerate(base)]


def test_gate_clear_win_promotes():
    decision = gate(report(noisy_requests(0.3)), CONFIG)
    assert decision.promote, decision.reasons
    assert all(r.startswith("ok: ") for r in decision.reasons)


def test_gate_tie_rejects():
    # Identical drafts: the interval is [0, 0] and 0 does not exceed min_gain 0.
    decision = gate(report([request(i, "code", 2.0 + i % 3, 2.0 + i % 3) for i in range(20)]), CONFIG)
    assert not decision.promote
    assert decision.reasons[0].startswith("FAIL: mean accepted length gain +0.0000")


def test_gate_noise_only_rejects_but_small_paired_gain_passes():
    # Unpaired, a 0.1 gain is buried under a ~0.7 spread of prompt difficulty; paired, it is clear.
    assert gate(report(noisy_requests(0.1)), CONFIG).promote
    assert not gate(report(noisy_requests(0.0)), CONFIG).promote


def test_gate_min_gain_is_respected():
    assert not gate(report(noisy_requests(0.3)), ShadowConfig(bootstrap_resamples=500, min_gain=0.5)).promote


def test_gate_slice_regression_rejects():
    # A large overall gain on code hides a 20 % drop on prose; prose must block the promotion.
    rows = [request(i, "code", 2.0, 3.5) for i in range(20)] + [request(i + 20, "prose", 3.0, 2.4) for i in range(10)]
    decision = gate(report(rows), CONFIG)
    assert not decision.promote
    assert [r for r in decision.reasons if r.startswith("FAIL")] == [
        "FAIL: slice 'prose': mean accepted length 3.0000 -> 2.4000 (-20.0%, tolerance -5%)"]
    # A per-slice tolerance can allow it.
    assert gate(report(rows), ShadowConfig(bootstrap_resamples=500, slice_tolerances={"prose": 0.25})).promote


def test_gate_lossless_failure_rejects_and_names_prompt():
    rows = noisy_requests(0.5)
    mismatch = [{"id": "r7", "model": "challenger", "first_difference": 3}]
    decision = gate(report(rows, mismatch), CONFIG)
    assert not decision.promote
    assert "mismatched prompt ids: r7" in decision.reasons[0]


def test_gate_too_few_requests_rejects():
    assert not gate(report(noisy_requests(1.0, n=4)), CONFIG).promote


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
    assert summary["overall"]["n"] == 3


def test_default_config_file_loads():
    config = load_config(ShadowConfig, "configs/shadow.yaml")
    assert config == ShadowConfig()


@pytest.mark.parametrize("override,field", [("confidence=1.5", "confidence"), ("slice_tolerance=2", "slice_tolerance"),
                                            ("min_requests=1", "min_requests"), ("k=0", "k")])
def test_config_rejects_bad_values(override, field):
    with pytest.raises(ValueError, match=field):
        load_config(ShadowConfig, "configs/shadow.yaml", [override])
    with pytest.raises(ConfigError, match="unknown"):
        load_config(ShadowConfig, None, ["min_gian=0.1"])


def test_canary_set_covers_slices():
    canary = load_canary(DEFAULT_CANARY)
    assert len(canary) >= 12 and {c.slice for c in canary} >= {"code", "prose", "chat"}
    assert len({c.id for c in canary}) == len(canary)


class RecordingTracker(NullTracker):
    """Keeps what was logged, to check the shadow run reaches the tracker."""

    def __init__(self):
        self.metrics, self.files = {}, []

    def log_metrics(self, metrics, step=None):
        self.metrics.update(metrics)

    def log_dict(self, data, name):
        self.files.append(name)

    def log_figure(self, figure, name):
        self.files.append(name)


def build_toy_models(root: Path) -> dict[str, Path]:
    """Save target, "good" and "bad" toy drafts under `root`; return their dirs.

    good: the target's own function (the target is good plus zeroed layers), so every draft token is
    accepted. bad: good with its output head rolled by one vocabulary row, so it always proposes the
    token after the one the target wants and is rejected at every step. Random toy models are useless
    here: they all collapse onto the same repeated token, so any two drafts would tie.
    """
    tokenizer = toy.build_tokenizer()
    good = toy.tiny_llama(tokenizer, n_layers=1, seed=1)
    target = toy.zero_extended_target(good, n_layers=2)
    bad = copy.deepcopy(good)
    bad.config.tie_word_embeddings = False
    bad.lm_head.weight = torch.nn.Parameter(good.lm_head.weight.detach().roll(1, dims=0).clone())
    return {name: toy.save_model(model, tokenizer, root / name)
            for name, model in (("target", target), ("good", good), ("bad", bad))}


@pytest.fixture(scope="module")
def toy_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    paths = build_toy_models(root)
    models = {name: load_model(path) for name, path in paths.items()}
    holdout = root / "holdout"
    rows = [{"request_id": f"h{i}", "slice": ("code", "prose")[i % 2], "max_new_tokens": 8,
             "prompt_token_ids": [1], "output_token_ids": [2],
             "prompt": models["target"].tokenizer.apply_chat_template(
                 [{"role": "user", "content": f"def f{i}(x): return"}], add_generation_prompt=True, tokenize=False)}
            for i in range(6)]
    Dataset.from_list(rows).save_to_disk(holdout)
    canary = root / "canary.jsonl"
    canary.write_text("".join(json.dumps({"id": f"c{i}", "slice": "chat", "max_new_tokens": 6, "prompt": p}) + "\n"
                              for i, p in enumerate(["Hello!", "What is the capital of France?"])))
    return models, holdout, canary


def test_shadow_replay_promotes_the_better_draft(toy_models, tmp_path):
    models, holdout, canary = toy_models
    config = ShadowConfig(bootstrap_resamples=500, canary_path=str(canary), min_requests=4)
    tracker = RecordingTracker()
    out = tmp_path / "report.json"
    result = run_shadow(models["bad"], models["good"], models["target"], holdout, config, tracker=tracker, out=out)
    assert result["decision"]["promote"], result["decision"]["reasons"]
    assert [r["source"] for r in result["requests"]] == ["holdout"] * 6 + ["canary"] * 2
    assert result["lossless"] == {"checked": 8, "mismatches": []}
    # The good draft is the target's function: every drafted token is accepted, k + 1 tokens per step.
    assert result["overall"]["challenger"]["acceptance_rate"] == 1.0
    assert result["overall"]["champion"]["acceptance_rate"] == 0.0
    assert result["overall"]["difference"]["ci_low"] > 1.0
    assert set(result["slices"]) == {"code", "prose", "chat"}
    assert result["overall"]["target_only_tokens_per_s"] > 0
    assert json.loads(out.read_text())["decision"] == result["decision"]
    assert out.with_suffix(".png").stat().st_size > 1000
    assert tracker.files == ["shadow_report.json", "shadow_slices.png"] and tracker.metrics["promote"] == 1.0


def test_sampled_shadow_replay_rejects_the_worse_draft(toy_models):
    models, holdout, _ = toy_models
    # Sampled replay: losslessness is then checked with extra greedy runs of each draft.
    config = ShadowConfig(bootstrap_resamples=500, include_canary=False, min_requests=4, temperature=0.7)
    result = run_shadow(models["good"], models["bad"], models["target"], holdout, config)
    assert not result["decision"]["promote"]
    assert result["lossless"] == {"checked": 6, "mismatches": []}
    assert result["overall"]["difference"]["ci_high"] < 0
