"""The router in the engine (draftwheel.serving.engine.routing) and the serving state files (draftwheel.serving.server.serving_state), on the
tiny random Llama pair of test_engine.

The router tries every servable arm once before it exploits (draftwheel.serving.engine.router), so with five arms the first
five requests cover all modes: that is what the arm-coverage assertions rely on. No assertion depends on
which arm wins, since rewards are wall-clock tokens/s of tiny models.
"""

import json

import pytest

from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.records import AcceptanceRecord, ModelId, Sampling, Step
from draftwheel.serving.engine.routing import RequestRouter, available_arms, champion_key
from draftwheel.serving.server.serve_config import ServeConfig
from draftwheel.serving.server.serving_state import StateSaver, attach_tier, read_suffix_stats, write_suffix_stats
from draftwheel.serving.engine.sink import JsonlSink
from draftwheel.serving.engine.suffix import SuffixIndex, newest_within, target_key
from tests.serving.test_engine import PROMPTS, pair  # noqa: F401

PARAMS = SamplingParams(max_new_tokens=12, k=3)


def build(pair, router=None, with_index=True):
    tokenizer, target, draft = pair
    loaded = from_objects(target, tokenizer, "target")
    index = SuffixIndex(target_key(loaded.model_id)) if with_index else None
    return Engine(loaded, from_objects(draft, tokenizer, "draft"), suffix_index=index, router=router,
                  prepack=False)


def test_router_picks_every_servable_arm_and_learns(pair):
    router = RequestRouter()
    engine = build(pair, router)
    completions = engine.generate(PROMPTS, PARAMS, slice="chat")
    modes = {c.record.mode for c in completions}
    assert modes == {"autoregressive", "draft", "suffix", "hybrid"}
    assert sum(router.pulls.values()) == len(PROMPTS) and min(router.pulls.values()) == 1
    k_of = {c.record.mode: {s.k for s in c.record.steps if s.source == "draft"} for c in completions}
    assert k_of["draft"] <= {2, 4} and k_of["hybrid"] <= {4}


def test_explicit_mode_bypasses_the_router(pair):
    router = RequestRouter()
    engine = build(pair, router)
    completion, = engine.generate(PROMPTS[:1], PARAMS, mode="draft")
    assert completion.record.mode == "draft" and router.pulls == {}


def test_arms_follow_what_the_engine_can_serve(pair):
    tokenizer, _, draft = pair
    lm = from_objects(draft, tokenizer, "draft")
    index = SuffixIndex("t")
    assert available_arms(None, None) == ["none"]
    assert available_arms(lm, None) == ["none", "draft_k2", "draft_k4"]
    assert available_arms(None, index) == ["none", "suffix"]
    assert "hybrid" in available_arms(lm, index)
    router = RequestRouter()
    engine = build(pair, router, with_index=False)
    assert {c.record.mode for c in engine.generate(PROMPTS[:4], PARAMS)} == {"autoregressive", "draft"}


def test_state_resets_when_the_champion_changes_and_survives_a_restart(pair, tmp_path):
    tokenizer, _, draft = pair
    path = tmp_path / "serving" / "router.json"
    router = RequestRouter(state_path=path)
    engine = build(pair, router)
    engine.generate(PROMPTS[:3], PARAMS)
    assert router.save() and json.loads(path.read_text())["champion"] == champion_key(engine.draft)

    restarted = RequestRouter(state_path=path)
    build(pair, restarted).generate(PROMPTS[:1], PARAMS)
    assert sum(restarted.pulls.values()) == 4  # the saved state kept learning

    engine.swap_draft(from_objects(draft, tokenizer, "draft-v2"))  # what draftwheel.serving.server.reload does on promotion
    engine.generate(PROMPTS[:1], PARAMS)
    assert sum(router.pulls.values()) == 1  # fresh for the new champion
    fresh = RequestRouter(state_path=path)
    build(pair, fresh).generate(PROMPTS[:1], PARAMS)  # the file names the old champion: fresh too
    assert router.save() and json.loads(path.read_text())["champion"] == champion_key(engine.draft)


def test_a_reward_for_a_replaced_champion_is_dropped(pair):
    tokenizer, _, draft = pair
    router = RequestRouter()
    engine = build(pair, router)
    pick = router.pick(engine.draft, engine.suffix_index, "chat", [1, 2, 3])
    router.learn(pick, from_objects(draft, tokenizer, "other"), 10.0, 0.5)
    assert sum(router.pulls.values()) == 0


def test_index_stats_count_suffix_steps(pair):
    engine = build(pair)
    engine.generate(PROMPTS, PARAMS, mode="autoregressive")  # fills the index with the target's outputs
    engine.generate(PROMPTS, PARAMS, mode="suffix")  # the same prompts again: the index drafts
    stats = engine.suffix_index.stats()
    assert stats["requests"] == 2 * len(PROMPTS) and stats["served_requests"] == len(PROMPTS)
    assert 0 < stats["hit_rate"] <= 1 and stats["suffix_acceptance_rate"] > 0.9  # greedy repeats itself


def record(target: ModelId, tokens: list[int], mode: str = "suffix") -> AcceptanceRecord:
    return AcceptanceRecord(request_id="r", ts=0.0, slice="s", target_id=target, draft_id=None,
                            mode=mode, sampling=Sampling(temperature=0.0, top_p=1.0, top_k=0, seed=None), prompt="p", prompt_token_ids=tokens[:2], output="o",
                            output_token_ids=tokens[2:], finish_reason="length",
                            steps=[Step(k=2, accepted=1, draft_token_ids=[5, 6], target_token_id=7, source="suffix")],
                            drafted_tokens=2, accepted_tokens=1, verify_steps=1)


def test_attach_tier_builds_the_index_from_the_logs_and_saves_state(pair, tmp_path):
    engine = build(pair, with_index=False)
    key = target_key(engine.target.model_id)
    with JsonlSink(tmp_path / "logs") as sink:
        for tokens in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 6]):
            sink.write(record(engine.target.model_id, tokens))
        sink.write(record(ModelId(name="another-target"), [9, 9, 9]))
    assert attach_tier(engine, ServeConfig(suffix_tier=False), tmp_path / "logs", tmp_path / "state") is None
    config = ServeConfig(suffix_tier=True, router=True, mode="hybrid")
    saver = attach_tier(engine, config, tmp_path / "logs", tmp_path / "state")
    assert engine.suffix_index.requests == 2 and engine.router is not None
    stats = read_suffix_stats(tmp_path / "state")
    assert stats["target"] == key and stats["requests"] == 2 and stats["hit_rate"] == 1.0
    engine.generate(PROMPTS[:1], PARAMS)  # the router picks; the index learns the request
    saver.start().stop()
    assert read_suffix_stats(tmp_path / "state")["requests"] == 3
    assert (tmp_path / "state" / "router.json").is_file()


def test_state_files_failure_paths(tmp_path):
    assert read_suffix_stats(tmp_path) is None
    (tmp_path / "suffix_stats.json").write_text("{half")
    assert read_suffix_stats(tmp_path) is None
    with pytest.raises(ValueError, match="every_s"):
        StateSaver(every_s=0)
    blocked = tmp_path / "file"
    blocked.write_text("")
    StateSaver(SuffixIndex("t"), root=blocked / "sub").save()  # logged, not raised
    assert write_suffix_stats(SuffixIndex("t"), tmp_path).is_file()


def test_startup_reads_only_the_newest_files(tmp_path):
    files = []
    for i, size in enumerate((50, 30, 30)):
        files.append(tmp_path / f"f{i}")
        files[-1].write_bytes(b"x" * size)
    assert newest_within(files, 60) == files[1:]
    assert newest_within(files, 10) == files[2:]  # always the newest one
    assert newest_within(files, 1000) == files


def test_serve_config_suffix_fields():
    assert ServeConfig().suffix_tier  # on by default: requests naming no mode are hybrid
    for bad, field in (({"mode": "fast"}, "mode"), ({"mode": "hybrid", "suffix_tier": False}, "mode"),
                       ({"suffix_max_tokens": 0}, "suffix_max_tokens"), ({"state_save_s": 0}, "state_save_s")):
        with pytest.raises(ValueError, match=field):
            ServeConfig(**bad)


def test_http_request_may_name_the_mode(pair):
    from fastapi.testclient import TestClient

    from draftwheel.serving.server.app import create_app

    engine = build(pair)
    config = ServeConfig(suffix_tier=True, mode="hybrid")
    body = {"model": engine.target.model_id.name, "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0}
    with TestClient(create_app(engine, config)) as client:
        for mode, status in (("suffix", 200), (None, 200), ("fast", 400), ("medusa", 400)):
            response = client.post("/v1/completions", json={**body, **({"mode": mode} if mode else {})})
            assert response.status_code == status, response.text
        assert client.get("/healthz").json()["suffix_index"]["requests"] == 2
    assert engine.suffix_index.stats()["served_requests"] == 2  # suffix, then the server's hybrid
