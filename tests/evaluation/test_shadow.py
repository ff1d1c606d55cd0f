"""Shadow replay end to end, the shipped config and the canary set (the gate's statistics: test_gate.py).

Replay tests use toy models: the "good" draft computes exactly the target's function (the target is the draft with extra
zeroed layers, so every draft token is accepted: mean accepted length k + 1), the "bad" draft is an
independent random model (few tokens accepted). A correct replay must therefore promote good over bad,
reject bad over good, and find every greedy output identical to target-only decoding.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from datasets import Dataset, load_from_disk

from draftwheel.config import ConfigError, load_config
from draftwheel.tracking import NullTracker
from draftwheel.serving import testing as toy
from draftwheel.serving.engine.engine import PromptTooLongError
from draftwheel.evaluation.gate import POOLED, ShadowConfig, slice_groups
from draftwheel.serving.loading import load_model
from draftwheel.evaluation.shadow import (AUTO_WORKERS_MIN_REQUESTS, DEFAULT_CANARY, ShadowRequest, exit_with_parent,
                                          load_canary, TIMED, replay_figures, replay_workers, run_shadow,
                                          slice_shards)


def test_default_config_file_loads():
    config = load_config(ShadowConfig, "configs/shadow.yaml")
    assert config == ShadowConfig()


@pytest.mark.parametrize("override,field", [("confidence=1.5", "confidence"), ("slice_tolerance=2", "slice_tolerance"),
                                            ("min_requests=1", "min_requests"), ("k=0", "k"),
                                            ("min_path_prob=1.0", "min_path_prob"),
                                            ("min_slice_requests=2", "min_slice_requests"),
                                            ("slice_tolerances={code: 1.5}", "slice_tolerances.code"),
                                            ("workers=-1", "workers")])
def test_config_rejects_bad_values(override, field):
    with pytest.raises(ValueError, match=field):
        load_config(ShadowConfig, "configs/shadow.yaml", [override])
    with pytest.raises(ConfigError, match="unknown"):
        load_config(ShadowConfig, None, ["min_gian=0.1"])


def test_canary_set_covers_slices():
    canary = load_canary(DEFAULT_CANARY)
    assert len(canary) >= 12 and {c.slice for c in canary} >= {"code", "prose", "chat"}
    assert len({c.id for c in canary}) == len(canary)


def test_canary_slices_a_round_does_not_train_on_pool_into_a_real_veto():
    """The canary's chat and prose are each below min_slice_requests, so they are judged together: the
    pool must be big enough for non-inferiority (a lower bound), not only the clear-regression rule."""
    canary = load_canary(DEFAULT_CANARY)
    counts = {name: sum(c.slice == name for c in canary) for name in ("chat", "prose")}
    config = ShadowConfig()
    groups = slice_groups(counts, config.min_slice_requests)
    assert groups[POOLED] == ["chat", "prose"]
    assert sum(counts.values()) >= config.min_slice_requests


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
    config = ShadowConfig(bootstrap_resamples=500, canary_path=str(canary), min_requests=4, suffix_tier=False,
                          metric="mean_accepted_length")
    tracker = RecordingTracker()
    out = tmp_path / "report.json"
    result = run_shadow(models["bad"], models["good"], models["target"], holdout, config, tracker=tracker, out=out)
    assert result["decision"]["promote"], result["decision"]["reasons"]
    assert result["decision"]["failed_checks"] == [] and result["decision"]["blocking_slices"] == []
    # 3 slices of 2-4 requests, all below min_slice_requests: each judged alone on a clear regression, then pooled.
    assert [row["group"] for row in result["decision"]["slices"]] == ["chat", "code", "prose", "other/pooled"]
    assert [r["source"] for r in result["requests"]] == ["holdout"] * 6 + ["canary"] * 2
    assert result["lossless"] == {"checked": 8, "mismatches": []}
    # The good draft is the target's function: every drafted token is accepted, k + 1 tokens per step.
    assert result["overall"]["challenger"]["acceptance_rate"] == 1.0
    assert result["overall"]["champion"]["acceptance_rate"] == 0.0
    assert result["overall"]["difference"]["ci_low"] > 1.0
    assert set(result["slices"]) == {"code", "prose", "chat"}
    assert json.loads(out.read_text())["decision"] == result["decision"]
    assert out.with_suffix(".png").stat().st_size > 1000
    assert tracker.files == ["shadow_report.json", "shadow_slices.png"] and tracker.metrics["promote"] == 1.0


def test_replay_processes_give_the_figures_one_process_gives(toy_models):
    """Two worker processes share out the prompts: each request's accepted lengths, tokens and the gate's
    decision are those of the in-process replay (only the timings differ)."""
    models, holdout, canary = toy_models
    config = ShadowConfig(bootstrap_resamples=500, canary_path=str(canary), min_requests=4, workers=1,
                          suffix_tier=False, metric="mean_accepted_length")  # the cost model's constants are timed
    alone = run_shadow(models["bad"], models["good"], models["target"], holdout, config)
    shared = run_shadow(models["bad"], models["good"], models["target"], holdout, replace(config, workers=2))
    assert (alone["workers"], shared["workers"]) == (1, 2)
    assert replay_figures(shared) == replay_figures(alone) and len(replay_figures(shared)) == 8
    assert set(replay_figures(alone)[0][1]["challenger"]) >= {"mean_accepted_length", "generated_tokens"}
    assert shared["lossless"] == alone["lossless"] == {"checked": 8, "mismatches": []}
    untimed = lambda decision: {**decision, "reasons": [r for r in decision["reasons"] if "wall clock" not in r]}
    assert untimed(shared["decision"]) == untimed(alone["decision"]) and shared["decision"]["promote"]


@pytest.mark.parametrize("suffix_tier", [False, True])
def test_a_replay_that_fails_in_a_worker_fails_the_shadow_run(toy_models, tmp_path, suffix_tier):
    """A prompt the engine refuses (longer than the target's context) raises in the caller, as in one
    process, whether the workers take prompts (the draft alone) or whole slices (as served): the
    flywheel's shadow step then fails and the champion stays."""
    models, holdout, _ = toy_models
    rows = load_from_disk(str(holdout)).to_list()
    rows[3]["prompt"] = "word " * 1100  # the toy target's context is 1024 positions
    bad = tmp_path / "holdout"
    Dataset.from_list(rows).save_to_disk(bad)
    config = ShadowConfig(bootstrap_resamples=200, include_canary=False, min_requests=4, workers=2,
                          suffix_tier=suffix_tier)
    with pytest.raises(PromptTooLongError, match="exceeds the model context"):
        run_shadow(models["bad"], models["good"], models["target"], bad, config)


def _watched_sleep(parent: int) -> None:
    exit_with_parent(parent, poll_s=0.05)
    time.sleep(30)


def test_a_replay_worker_ends_when_its_parent_is_gone():
    """The watcher of a pool worker: once the pid it was started by is not its parent any more (here: a
    pid that never was), the process exits instead of waiting for work that will never come."""
    ctx = multiprocessing.get_context("spawn")
    orphan = ctx.Process(target=_watched_sleep, args=(os.getpid() + 10**6,))
    orphan.start()
    orphan.join(timeout=20)
    assert orphan.exitcode == 1
    child = ctx.Process(target=_watched_sleep, args=(os.getpid(),))  # its parent is alive: it keeps running
    child.start()
    child.join(timeout=2)
    assert child.is_alive()
    child.kill()
    child.join()


def test_as_served_replay_processes_take_whole_slices_with_the_same_figures(toy_models, monkeypatch):
    """As served, each process replays whole slices in request order, so each draft's step pace carries from
    one request of a slice to the next as in one process: with the cost model's constants fixed (they are
    timed), every request's figures, the lossless check and the decision are those of the in-process replay."""
    from draftwheel.evaluation import shadow
    from draftwheel.serving.engine.adaptive import ModelledTime

    models, holdout, canary = toy_models
    monkeypatch.setattr(shadow, "served_row_costs", lambda target, config: ([1.0 + 0.05 * n for n in range(64)], 0.01))
    monkeypatch.setattr(shadow, "modelled_times",
                        lambda models, config, request, row_costs: {arm: ModelledTime(0.05, 0.3) for arm in shadow.ARMS})
    config = ShadowConfig(bootstrap_resamples=500, canary_path=str(canary), min_requests=4, workers=1,
                          metric="mean_accepted_length")
    alone = run_shadow(models["bad"], models["good"], models["target"], holdout, config)
    shared = run_shadow(models["bad"], models["good"], models["target"], holdout, replace(config, workers=4))
    assert (alone["workers"], shared["workers"]) == (1, 3)  # never more processes than the 3 slices
    assert replay_figures(shared) == replay_figures(alone) and len(replay_figures(shared)) == 8
    assert [row["id"] for row in shared["requests"]] == [row["id"] for row in alone["requests"]]
    assert {row["champion"]["mode"] for row in shared["requests"]} == {"hybrid"}
    assert "draft_alone" in shared["requests"][0]["challenger"]
    assert shared["lossless"] == alone["lossless"] == {"checked": 8, "mismatches": []}
    untimed = lambda decision: {**decision, "reasons": [r for r in decision["reasons"] if "wall clock" not in r]}
    assert untimed(shared["decision"]) == untimed(alone["decision"]) and shared["decision"]["promote"]


def test_slice_shards_keep_request_order_largest_slice_first():
    requests = [ShadowRequest(id=str(n), prompt="p", slice=s, max_new_tokens=4, chat=False, source="holdout")
                for n, s in enumerate(["chat", "code", "code", "prose", "code", "chat"])]
    assert [[index for index, _ in shard] for shard in slice_shards(requests)] == [[1, 2, 4], [0, 5], [3]]


def test_as_served_replay_on_the_clock_stays_in_one_process():
    """With the choices on the clock, processes sharing the CPU would change each other's choices."""
    with pytest.raises(ValueError, match="workers: with suffix_tier"):
        ShadowConfig(suffix_tier=True, modelled_time=False, workers=2)
    assert replay_workers(ShadowConfig(suffix_tier=True, modelled_time=False), 100, 3) == 1


def test_auto_replays_in_process_until_starting_workers_pays():
    alone = ShadowConfig(suffix_tier=False)
    assert replay_workers(alone, AUTO_WORKERS_MIN_REQUESTS - 1) == 1
    cores = len(os.sched_getaffinity(0))
    assert replay_workers(alone, AUTO_WORKERS_MIN_REQUESTS) == min(cores, 4)
    assert replay_workers(ShadowConfig(workers=3, suffix_tier=False), 100) == 3
    assert replay_workers(ShadowConfig(workers=3, suffix_tier=False), 2) == 2  # never more processes than requests
    served = ShadowConfig(suffix_tier=True)  # whole slices per process
    assert replay_workers(served, AUTO_WORKERS_MIN_REQUESTS - 1, 3) == 1
    assert replay_workers(served, 100, 3) == min(cores, 4, 3)
    assert replay_workers(served, 100, 1) == 1
    assert replay_workers(replace(served, workers=4), 100, 2) == 2


def test_sampled_shadow_replay_rejects_the_worse_draft(toy_models):
    models, holdout, _ = toy_models
    # Sampled replay: losslessness is then checked with extra greedy runs of each draft.
    config = ShadowConfig(bootstrap_resamples=500, include_canary=False, min_requests=4, temperature=0.7)
    result = run_shadow(models["good"], models["bad"], models["target"], holdout, config)
    assert not result["decision"]["promote"]
    assert result["lossless"] == {"checked": 6, "mismatches": []}
    assert result["overall"]["difference"]["ci_high"] < 0


def test_shadow_replay_with_the_suffix_tier(toy_models):
    models, holdout, _ = toy_models
    # With the tier both drafts run in mode hybrid: the bad draft (never accepted alone, accepted length
    # exactly 1.0 in mode draft) now gains from suffix drafts (toy outputs repeat, so the request's own
    # part proposes well), which shrinks the good draft's edge: in mode draft it is > 1.0 token per step
    # at the CI's lower bound (test_shadow_replay_promotes_the_better_draft). The replay stays lossless.
    config = ShadowConfig(bootstrap_resamples=500, include_canary=False, min_requests=4, suffix_tier=True)
    result = run_shadow(models["bad"], models["good"], models["target"], holdout, config)
    assert result["lossless"] == {"checked": 6, "mismatches": []}
    # accepted length, not the gated speed: the speed comes from timed costs, and a loaded machine moves it
    assert result["overall"]["champion"]["mean_accepted_length"] > 1.0
    assert result["overall"]["difference"]["mean"] < 1.0
    assert result["config"]["suffix_tier"] is True


def test_modelled_time_makes_the_as_served_replay_repeat_itself(toy_models, monkeypatch):
    """With `modelled_time` the hybrid's choices read the cost model's step times: the report carries
    each draft's measured constants, and given the same constants two replays of the same prompts give
    the same per-request figures (only the timed ones differ)."""
    from draftwheel.evaluation import shadow
    from draftwheel.serving.engine.adaptive import ModelledTime

    models, holdout, _ = toy_models
    config = ShadowConfig(bootstrap_resamples=500, include_canary=False, min_requests=4, suffix_tier=True)
    assert config.modelled_time  # the gate's default
    measured = run_shadow(models["bad"], models["good"], models["target"], holdout, config)
    timing = measured["cost_model"]["modelled_time"]
    assert set(timing) == {"champion", "challenger"} and all(t["row_slope"] >= 0.0 for t in timing.values())
    assert all(t["row_costs"][0] == 1.0 and t["row_costs"] == sorted(t["row_costs"]) for t in timing.values())
    assert timing["challenger"]["draft_c"] > 0.0
    same_shapes = ([p.shape for p in models["bad"].model.parameters()]
                   == [p.shape for p in models["good"].model.parameters()])
    assert (timing["champion"]["draft_c"] == timing["challenger"]["draft_c"]) == same_shapes

    fixed = {arm: ModelledTime(row_slope=0.05, draft_c=0.05) for arm in ("champion", "challenger")}
    monkeypatch.setattr(shadow, "modelled_times", lambda *args: fixed)
    first, second = (run_shadow(models["bad"], models["good"], models["target"], holdout, config) for _ in range(2))
    untimed = lambda report: [(id_, {arm: {**f, "draft_alone": {k: v for k, v in f["draft_alone"].items()
                                                               if k not in TIMED}} for arm, f in arms.items()})
                              for id_, arms in replay_figures(report)]
    assert untimed(first) == untimed(second)
    off = run_shadow(models["bad"], models["good"], models["target"], holdout, ShadowConfig(
        bootstrap_resamples=500, include_canary=False, min_requests=4, suffix_tier=True, modelled_time=False))
    assert not off["config"]["modelled_time"] and off["cost_model"]["modelled_time"] == {}
    assert off["lossless"] == first["lossless"]


def test_each_drafts_c_is_timed_against_its_own_replays_verify_forwards():
    """The cost model's c divides drafting seconds by the plain step's seconds read off the same replays'
    verify forwards: a machine twice as loaded during one arm's replays leaves its c, and so its
    modelled speed, where it was."""
    from draftwheel.evaluation.shadow import add_served_speedup

    def figures(load: float) -> dict:
        # 10 tokens from 4 steps costing 5 plain steps, 8 drafted tokens; drafting 0.4 s, verifying 1 s
        return {"draft_s": 0.4 * load, "verify_s": 1.0 * load, "verify_cost": 5.0, "model_drafted": 8,
                "step_tokens": 10}

    rows = [{"champion": figures(1.0), "challenger": figures(2.0)} for _ in range(3)]
    costs = add_served_speedup(rows)
    assert costs == {"champion": pytest.approx(0.25), "challenger": pytest.approx(0.25)}  # 0.05 s a token / 0.2 s
    assert [row[arm]["served_speedup"] for row in rows for arm in ("champion", "challenger")] == \
        pytest.approx([10 / (5.0 + 0.25 * 8)] * 6)


def test_a_lossy_challenger_is_caught_and_reported_against_target_only_decoding(toy_models, monkeypatch):
    models, holdout, _ = toy_models
    import draftwheel.evaluation.shadow as shadow

    replay = shadow._run

    def lossy(engine, request, params, mode=None):
        """The good draft's engine changes the third token of every output (a lossy draft)."""
        completion = replay(engine, request, params, mode)
        if engine._draft is models["good"]:
            completion.token_ids[2] = (completion.token_ids[2] + 1) % models["target"].model.config.vocab_size
        return completion

    monkeypatch.setattr(shadow, "_run", lossy)
    config = ShadowConfig(bootstrap_resamples=500, include_canary=False, min_requests=4, workers=1, suffix_tier=False)
    result = run_shadow(models["bad"], models["good"], models["target"], holdout, config)
    assert result["lossless"]["mismatches"] == [{"id": f"h{i}", "model": "challenger", "mode": "draft",
                                                 "first_difference": 2} for i in range(6)]
    assert not result["decision"]["promote"]
    assert any("lossless" in reason for reason in result["decision"]["failed_checks"])


def test_identical_outputs_take_one_target_check_per_prompt(toy_models, monkeypatch):
    """Both arms' greedy outputs are the target's, token for token: the teacher-forced check runs once per
    prompt, not once per arm (the lossy case above shows a differing arm is still checked on its own)."""
    models, holdout, _ = toy_models
    import draftwheel.evaluation.shadow as shadow

    calls = []
    check = shadow._is_target_greedy
    monkeypatch.setattr(shadow, "_is_target_greedy", lambda *args: calls.append(1) or check(*args))
    config = ShadowConfig(bootstrap_resamples=200, include_canary=False, min_requests=4, workers=1)
    result = run_shadow(models["bad"], models["good"], models["target"], holdout, config)
    assert result["lossless"] == {"checked": 6, "mismatches": []} and len(calls) == 6


def test_as_served_replay_reads_the_serving_logs_but_never_the_replayed_prompts(toy_models, tmp_path):
    """The index is what serving had: the logged requests, less any whose prompt is replayed now (their
    logged answers are the replay's answers, which it would copy verbatim). The report carries both arms
    as served and alone, and the cost model's constants."""
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.engine.params import SamplingParams
    from draftwheel.evaluation.shadow import load_requests, served_index
    from draftwheel.serving.engine.sink import JsonlSink

    models, holdout, canary = toy_models
    config = ShadowConfig(bootstrap_resamples=200, canary_path=str(canary), min_requests=4,
                          suffix_logs=str(tmp_path / "logs"))
    requests = load_requests(holdout, config)
    sink = JsonlSink(tmp_path / "logs")
    engine = Engine(models["target"], sink=sink)
    engine.generate([requests[0].prompt, "an earlier request"], SamplingParams(max_new_tokens=8))
    engine.generate([requests[-1].prompt], SamplingParams(max_new_tokens=8), chat=True)  # a logged canary prompt
    sink.close()
    assert served_index(engine, requests, config).requests == 1  # only "an earlier request"
    assert served_index(engine, requests, replace(config, suffix_logs=str(tmp_path / "none"))).requests == 0

    result = run_shadow(models["bad"], models["good"], models["target"], holdout, config)
    assert result["lossless"] == {"checked": 8, "mismatches": []}
    for arm in ("champion", "challenger"):
        row = result["requests"][0][arm]
        assert row["mode"] == "hybrid" and row["draft_alone"]["mode"] == "draft"
        assert result["overall"][arm]["draft_alone"]["mean_accepted_length"] >= 1.0
    # the good draft is accepted everywhere alone; the bad one never
    assert result["overall"]["challenger"]["draft_alone"]["acceptance_rate"] == 1.0
    assert result["overall"]["champion"]["draft_alone"]["acceptance_rate"] == 0.0
    assert result["metric"] == "served_speedup"
    costs = result["cost_model"]
    # up to a token tree of k drafted tokens beside the index's longest proposal (16)
    assert costs["row_costs"][0] == 1.0 and len(costs["row_costs"]) == 1 + config.k + 16
    assert set(costs["draft_c"]) == {"champion", "challenger", "champion/draft_alone", "challenger/draft_alone"}
    assert result["overall"]["challenger"]["mean"] > result["overall"]["champion"]["mean"]
